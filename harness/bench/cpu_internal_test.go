package bench

import (
	"bufio"
	"os/exec"
	"testing"
	"time"
)

// cpuTime counts a child that still runs, with what it has waited for:
// here a shell whose subshell burned CPU and ended, the shape of the
// sandbox's spawner and the launchers it forks.
func TestCPUTimeCountsLiveChildren(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", `(i=0; while [ $i -lt 800000 ]; do i=$((i+1)); done); echo burned; read x`)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	before := liveChildrenCPU()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "burned\n" {
		t.Fatalf("the shell said %q, %v", line, err)
	}
	// The loop takes about a second of CPU here (time(1) reads 0.55 s
	// for half of it); the subshell is done and waited for by the shell, so
	// its CPU is in the shell's children's time.
	if got := liveChildrenCPU() - before; got < 200*time.Millisecond {
		t.Errorf("liveChildrenCPU grew by %s while a live child's waited-for subshell burned about a second", got)
	}
}
