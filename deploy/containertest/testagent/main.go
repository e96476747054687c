// Command testagent is a static sub-agent for the container tests: FROM
// scratch worker images have no shell and no sleep.
//
//	testagent sleep <duration>   sleep, then write {"slept": <duration>, ...} to the output file
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 3 || os.Args[1] != "sleep" {
		fmt.Fprintln(os.Stderr, "usage: testagent sleep <duration>")
		os.Exit(2)
	}
	d, err := time.ParseDuration(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "testagent:", err)
		os.Exit(2)
	}
	out := os.Getenv("AGORA_OUTPUT_FILE")
	if out == "" {
		fmt.Fprintln(os.Stderr, "testagent: AGORA_OUTPUT_FILE is not set (run it as a sub-agent)")
		os.Exit(2)
	}
	fmt.Println("sleeping", d)
	time.Sleep(d)
	b, _ := json.Marshal(map[string]string{
		"slept": d.String(), "dispatch_id": os.Getenv("AGORA_DISPATCH_ID"), "host": hostname(),
	})
	if err := os.WriteFile(out, b, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "testagent:", err)
		os.Exit(1)
	}
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
