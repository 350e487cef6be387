package agentsock

import "time"

// Decision is what one plugin run decided, as its decision line says: what
// the agent counts (installer/metrics) and records Events for
// (installer/podevents). A call the agent runs hands it over in process
// (cniplugin.Server's Decided); the standalone plugin's is read back from
// its log file (installer/pluginlog), so its strings are bounded where
// they are used.
type Decision struct {
	Command   string // ADD, DEL, CHECK, ...
	Decision  string // capture, skip, remove, error
	Namespace string
	Pod       string
	RanBy     string // agent or standalone
	Error     string // the CNI error of a failed run
	Lookup    string // where the pod came from: agent or api; "" for none
	// Took is the run's time, LookupTook its pod lookup's; negative when
	// the line says none.
	Took, LookupTook time.Duration
}
