// Package oneproc sets GOMAXPROCS to 1 while the process initialises, and
// gives the main goroutine a stack it will not outgrow, for short-lived
// commands that run one goroutine at a time (the redirect CLI, the
// standalone CNI plugin): a binary gets both by importing the package, for
// its side effect.
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

// A goroutine starts with a 2 KB stack, and the runtime doubles it (a new
// stack, the frames copied, every frame's pointers adjusted, which reads
// the binary's tables for each frame) each time a call does not fit. A
// command's main goroutine goes through the package inits, the flag
// parsing and the netlink code: five or six doublings, each copying a
// deeper stack, and each new stack and each table page a page fault. It
// was 7.5% of a `redirect apply`'s CPU (perf). Called once here, before
// the other packages' inits, growStack's frame makes the runtime size the
// stack for it in one step (it doubles until the frame fits) while the
// stack is shallow; stacks shrink only in a garbage collection, which a
// command that allocates a few hundred KB does not reach.
func init() { runtime.KeepAlive(growStack(Stack)) }

// Stack is the size of growStack's frame: the main goroutine's stack is at
// least twice that from then on.
const Stack = 32 << 10

//go:noinline
func growStack(i int) byte {
	var b [Stack]byte
	// Written and read at positions the compiler cannot know, so the array
	// is kept, on the stack (it does not escape).
	b[(i-1)%len(b)] = byte(i)
	return b[(i*7)%len(b)]
}
