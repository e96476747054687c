// Package archtest holds no code, only a test that keeps the module's import
// direction true (STYLE "Shape"): services never import each other,
// pkg/sentinel imports nothing from the module, and the packages under pkg/
// import nothing under services/, answerers/ or cmd/. It reads the import
// graph from `go list`.
package archtest
