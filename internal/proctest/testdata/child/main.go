// Command child is the process the proctest tests start: it logs like an
// rtcedge role, then waits for SIGTERM (or exits at once with -exit).
package main

import (
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	exit := flag.Int("exit", -1, "exit with this status right after starting")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	log.Info("child up", "addr", "127.0.0.1:0", "note", `a "quoted" value`, "env", os.Getenv("PROCTEST_CHILD"))
	if *exit >= 0 {
		log.Info("exiting early", "status", *exit)
		os.Exit(*exit)
	}
	<-term
	log.Info("stopping")
}
