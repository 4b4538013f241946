package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"
)

// profileDirEnv names a directory to write CPU and heap profiles to. When it
// is set, SIGUSR1 starts a CPU profile (cpu.pprof) and SIGUSR2 stops it and
// writes a heap profile (heap.pprof and allocs.pprof), so a load test can
// profile exactly its measurement window of a running role. The capacity
// benchmark uses it (docs/benchmarks.md); production never sets it.
const profileDirEnv = "RTCEDGE_PROFILE_DIR"

func init() {
	dir := os.Getenv(profileDirEnv)
	if dir == "" {
		return
	}
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGUSR1, syscall.SIGUSR2)
	go profileOnSignal(dir, ch)
}

// profileOnSignal serves the profile signals for the life of the process.
func profileOnSignal(dir string, ch <-chan os.Signal) {
	var cpu *os.File
	for s := range ch {
		switch {
		case s == syscall.SIGUSR1 && cpu == nil:
			f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
			if err != nil {
				fmt.Fprintln(os.Stderr, "cpu profile:", err)
				continue
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				fmt.Fprintln(os.Stderr, "cpu profile:", err)
				f.Close()
				continue
			}
			cpu = f
		case s == syscall.SIGUSR2 && cpu != nil:
			pprof.StopCPUProfile()
			cpu.Close()
			cpu = nil
			runtime.GC() // the heap profile shows live data as of the last GC
			for _, name := range []string{"goroutine", "heap", "allocs"} {
				if err := writeProfile(filepath.Join(dir, name+".pprof"), name); err != nil {
					fmt.Fprintln(os.Stderr, name+" profile:", err)
				}
			}
		}
	}
}

// writeProfile writes a named profile under a temporary name and renames
// it, so a reader waiting for the file never sees half of it.
func writeProfile(path, name string) error {
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
