// Package oneproc sets GOMAXPROCS to 1 while the process initialises, for
// short-lived commands that run one goroutine at a time (the redirect CLI):
// a binary gets it by importing the package, for its side effect.
//
// With a second P the runtime wakes an idle thread at every goroutine it
// starts or readies, which finds nothing to do; package initialisation
// already starts some (os's finalizer and cleanup goroutines). Setting
// GOMAXPROCS from main comes too late for those, and its stop-the-world
// then waits for the thread they woke, which on a loaded machine is still
// waiting for a CPU (measured: 0.2-0.3 ms median, over 1 ms at times).
// Here it runs before any of that: package initialisation goes in import
// path order among the packages whose imports are initialised, and this
// one imports nothing but the runtime, so it comes ahead of every package
// that starts a goroutine (TestInitialisedBeforeOS), while the runtime's
// own start-up threads have little left to do.
package oneproc

import "runtime"

// Procs is GOMAXPROCS as the runtime chose it, before this package set it
// to 1: what to give back for work that runs in parallel.
var Procs = runtime.GOMAXPROCS(1)
