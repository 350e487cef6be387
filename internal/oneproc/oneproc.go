// Package oneproc sets GOMAXPROCS to 1 while the process initialises, for
// short-lived commands that run one goroutine at a time (the redirect CLI):
// a binary gets it by importing the package, for its side effect.
//
// With a second P the runtime wakes an idle thread at every goroutine it
// starts or readies, which finds nothing to do; package initialisation
// already starts some (the runtime's finalizer goroutine, first needed by
// os's init, and its cleanup goroutine). Set from main, GOMAXPROCS comes
// too late for those, and its stop-the-world then waits for the thread
// they woke, which on a loaded machine may still be waiting for a CPU
// (measured: 0.2-0.3 ms median, over 1 ms at times; here, tens of µs).
// Package initialisation goes in import path order among the packages
// whose imports are initialised; this one imports only the runtime, so it
// comes ahead of os and of every package that starts a goroutine
// (TestInitialisedBeforeOS).
package oneproc

import "runtime"

// Procs is GOMAXPROCS as the runtime chose it, before this package set it
// to 1: what to give back for work that runs in parallel.
var Procs = runtime.GOMAXPROCS(1)
