// Package archtest holds no code, only tests that keep the module's floors
// true (docs/design.md, "Components"). Top-down: cmd/, agoratest/,
// stack/ and harness/ assemble or drive a whole Agora; services/ and
// answerers/ below them; the runtime helpers of internal/ below those; pkg/
// at the bottom. Nothing imports a floor above its own: no service,
// answerer, runtime helper or public package imports the top floor; the
// harness never imports cmd/; stack/ imports none of cmd/, harness/ or
// agoratest/. Services never import each other, pkg/sentinel imports
// nothing from the module, the packages under pkg/ import nothing of the
// module outside pkg/, and internal/sandbox/launcher, every run's PID 1,
// imports nothing of the module outside itself. The rules read the import
// graph from `go list`. A file rule keeps `agora subagent check` free of
// services: a file of cmd/ that imports internal/sandbox/contain imports
// no service. Another test keeps every init from taking over a process
// but the sandbox launcher's, and one that every docs page and heading a
// comment cites exists.
package archtest
