// Package harness holds what drives a whole Agora from outside: the
// benchmark (bench), the chaos audit (chaos) and the system-test starter
// (systemtest). They sit on the top floor beside cmd/, start Agora through
// stack, and import the services and answerers; nothing in services/,
// answerers/, internal/ or pkg/ imports them, and they never import cmd/
// (the tests of internal/archtest keep it so; docs/design.md, "Components").
// Read top-down: cmd/, agoratest/, stack/, harness/ → services/, answerers/ →
// internal/ → pkg/.
package harness
