#!/bin/sh
# A sub-agent in plain shell. Round 0 asks which environment to deploy to;
# the resumed round reads the answer from input.json and finishes.
set -eu
answer=$(sed -n 's/.*"answer": *"\([^"]*\)".*/\1/p' "$AGORA_INPUT_FILE")
if [ -z "$answer" ]; then
  cat > "$AGORA_NEEDS_INPUT_FILE" <<JSON
{"question": "Deploy to staging or production?",
 "options": ["staging", "production"],
 "context": "The change touches the billing schema.",
 "kind": "decision",
 "partial_state": {"checked": ["migrations apply cleanly", "tests pass"]}}
JSON
  exit 0
fi
printf '{"deployed_to": "%s"}\n' "$answer" > "$AGORA_OUTPUT_FILE"
