package genclient

// The client is generated from the repository's OpenAPI document by
// oapi-codegen, a tool dependency in go.mod; its tests keep it current and
// drive a whole thread through it (docs/api.md).
//go:generate go tool oapi-codegen -config config.yaml ../agora.json
