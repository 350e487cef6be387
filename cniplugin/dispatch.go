package cniplugin

// The CNI protocol's entry. The plugin's own process (Main) uses the CNI
// library's skel. The agent runs many calls at once, each with the
// environment and stdio the front handed it, which skel cannot take (it
// reads the process's own): dispatch is skel's sequence built from the
// library's own rules (utils.Validate*, version.ConfigDecoder,
// version.Reconciler), proven equal to skel by TestDispatchMatchesSkel and
// its fuzz target. It leaves out skel's second look at CNI_NETNS after ADD
// and DEL: the plugin refuses its own namespace before it touches anything.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"
	cniversion "github.com/containernetworking/cni/pkg/version"
)

// cmdArgs is one invocation's CNI_* values and config.
type cmdArgs = skel.CmdArgs

// cniEnv is what dispatch reads of a call: its environment and stdio.
type cniEnv struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// The CNI_* variables each verb requires besides CNI_COMMAND, as skel has
// them.
var requiredFor = map[string][]string{
	"ADD":    {"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"},
	"CHECK":  {"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"},
	"DEL":    {"CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"},
	"GC":     {"CNI_PATH"},
	"STATUS": {"CNI_PATH"},
}

// envOrder is the order skel reads (and reports missing) variables in.
var envOrder = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

// verbSince is the lowest config version each newer verb exists in.
var verbSince = map[string]string{"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}

// dispatch runs one CNI call: the verb's function, or VERSION, or the
// about text when there is no command. The error it returns is what the
// plugin prints on stdout before exiting 1.
func dispatch(e cniEnv, funcs skel.CNIFuncs, versions cniversion.PluginInfo, about string) *types.Error {
	cmd, args, err := readCall(e)
	if err != nil {
		if err.Code == types.ErrInvalidEnvironmentVariables && e.getenv("CNI_COMMAND") == "" && about != "" {
			fmt.Fprintln(e.stderr, about)
			fmt.Fprintf(e.stderr, "CNI protocol versions supported: %s\n", strings.Join(versions.SupportedVersions(), ", "))
			return nil
		}
		return err
	}
	fn := map[string]func(*cmdArgs) error{"ADD": funcs.Add, "CHECK": funcs.Check, "DEL": funcs.Del, "GC": funcs.GC, "STATUS": funcs.Status}[cmd]
	switch {
	case cmd == "VERSION":
		if err := versions.Encode(e.stdout); err != nil {
			return types.NewError(types.ErrIOFailure, err.Error(), "")
		}
		return nil
	case requiredFor[cmd] == nil:
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %v", cmd), "")
	}
	confVersion, verr := (&cniversion.ConfigDecoder{}).Decode(args.StdinData)
	if verr != nil {
		return types.NewError(types.ErrDecodingFailure, verr.Error(), "")
	}
	if min := verbSince[cmd]; min != "" {
		ok, err := cniversion.GreaterThanOrEqualTo(confVersion, min)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, err.Error(), "")
		}
		if !ok {
			return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("config version does not allow %s", cmd), "")
		}
		// No error here: confVersion parsed just above, and our versions are valid.
		if !slices.ContainsFunc(versions.SupportedVersions(), func(v string) bool {
			ge, _ := cniversion.GreaterThanOrEqualTo(v, confVersion)
			return ge
		}) {
			return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("plugin version does not allow %s", cmd), "")
		}
	}
	if verr := (&cniversion.Reconciler{}).Check(confVersion, versions); verr != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions", verr.Details())
	}
	if fn == nil {
		return nil
	}
	if err := fn(args); err != nil {
		var te *types.Error
		if errors.As(err, &te) {
			return te
		}
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	return nil
}

// readCall reads the call's CNI_* variables, checks those its verb needs,
// reads stdin and checks the config's network name, as skel does.
func readCall(e cniEnv) (string, *cmdArgs, *types.Error) {
	cmd := e.getenv("CNI_COMMAND")
	vals := map[string]string{}
	var missing []string
	for _, name := range envOrder {
		v := e.getenv(name)
		vals[name] = v
		required := name == "CNI_COMMAND" || slices.Contains(requiredFor[cmd], name)
		var terr *types.Error
		switch {
		case v == "" && required:
			missing = append(missing, name)
		case v != "" && required && name == "CNI_CONTAINERID":
			terr = utils.ValidateContainerID(v)
		case v != "" && required && name == "CNI_IFNAME":
			terr = utils.ValidateInterfaceName(v)
		}
		if terr != nil {
			return "", nil, terr
		}
	}
	if len(missing) > 0 {
		return "", nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("required env variables [%s] missing", strings.Join(missing, ",")), "")
	}
	var stdin []byte
	if cmd != "VERSION" {
		var err error
		if stdin, err = io.ReadAll(e.stdin); err != nil {
			return "", nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("error reading from stdin: %v", err), "")
		}
		var conf struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(stdin, &conf); err != nil {
			return "", nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("error unmarshall network config: %v", err), "")
		}
		if conf.Name == "" {
			return "", nil, types.NewError(types.ErrInvalidNetworkConfig, "missing network name", "")
		}
		if terr := utils.ValidateNetworkName(conf.Name); terr != nil {
			return "", nil, terr
		}
	}
	return cmd, &cmdArgs{
		ContainerID:   vals["CNI_CONTAINERID"],
		Netns:         vals["CNI_NETNS"],
		IfName:        vals["CNI_IFNAME"],
		Args:          vals["CNI_ARGS"],
		Path:          vals["CNI_PATH"],
		NetnsOverride: vals["CNI_NETNS_OVERRIDE"],
		StdinData:     stdin,
	}, nil
}
