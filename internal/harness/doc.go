// Package harness holds what drives a whole Agora from outside: the
// benchmark (bench), the chaos audit (chaos) and the system-test starter
// (systemtest). They import the services and answerers; nothing in
// services/, answerers/, pkg/ or the rest of internal/ imports them (the
// tests of internal/archtest keep it so). Read top-down: cmd/ → harness →
// services/, answerers/ → pkg/ and internal/ runtime helpers.
package harness
