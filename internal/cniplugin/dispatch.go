package cniplugin

// The CNI protocol's entry: which verb, its environment, the config on
// stdin, the version checks, and errors printed as JSON. It follows the CNI
// library's skel package rule for rule (an equivalence test runs both on
// the same inputs), without what skel costs every run of a short-lived
// plugin: a regular expression compiled at start-up, the config decoded
// three times, and a second look at CNI_NETNS after the verb (this plugin
// refuses its own namespace by identity before it touches anything).

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	cniversion "github.com/containernetworking/cni/pkg/version"
)

// cmdArgs is one invocation's CNI_* values and config (skel.CmdArgs' fields).
type cmdArgs struct {
	ContainerID   string
	Netns         string
	IfName        string
	Args          string
	Path          string
	NetnsOverride string
	StdinData     []byte
}

// verbFunc runs one CNI verb.
type verbFunc func(*cmdArgs) error

// verbs are the plugin's verb functions by CNI_COMMAND.
type verbs struct{ Add, Check, Del, GC, Status verbFunc }

// cniEnv is what dispatch reads of the process: its environment and stdio.
type cniEnv struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// Which CNI_* variables each verb requires (CNI_COMMAND always is).
var requiredFor = map[string][]string{
	"ADD":    {"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"},
	"CHECK":  {"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"},
	"DEL":    {"CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"},
	"GC":     {"CNI_PATH"},
	"STATUS": {"CNI_PATH"},
}

// envOrder is the order skel reads (and reports missing) variables in.
var envOrder = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

// dispatch runs one CNI command: the verb's function, or VERSION, or the
// about text when there is no command. The error it returns is what the
// plugin prints on stdout before exiting 1.
func dispatch(e cniEnv, funcs verbs, versions cniversion.PluginInfo, about string) *types.Error {
	cmd := e.getenv("CNI_COMMAND")
	vals := map[string]string{}
	var missing []string
	for _, name := range envOrder {
		v := e.getenv(name)
		vals[name] = v
		required := name == "CNI_COMMAND" || contains(requiredFor[cmd], name)
		switch {
		case v == "" && required:
			missing = append(missing, name)
		case v != "" && required && name == "CNI_CONTAINERID":
			if err := validContainerID(v); err != nil {
				return err
			}
		case v != "" && required && name == "CNI_IFNAME":
			if err := validIfName(v); err != nil {
				return err
			}
		}
	}
	if len(missing) > 0 {
		if cmd == "" && about != "" {
			fmt.Fprintln(e.stderr, about)
			fmt.Fprintf(e.stderr, "CNI protocol versions supported: %s\n", strings.Join(versions.SupportedVersions(), ", "))
			return nil
		}
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("required env variables [%s] missing", strings.Join(missing, ",")), "")
	}
	if cmd == "VERSION" {
		if err := versions.Encode(e.stdout); err != nil {
			return types.NewError(types.ErrIOFailure, err.Error(), "")
		}
		return nil
	}
	stdin, err := io.ReadAll(e.stdin)
	if err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("error reading from stdin: %v", err), "")
	}
	if _, known := requiredFor[cmd]; !known {
		// skel reads and checks the config before it looks at the verb.
		if _, terr := configHead(stdin, false); terr != nil {
			return terr
		}
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %v", cmd), "")
	}
	head, terr := configHead(stdin, true)
	if terr != nil {
		return terr
	}
	args := &cmdArgs{
		ContainerID:   vals["CNI_CONTAINERID"],
		Netns:         vals["CNI_NETNS"],
		IfName:        vals["CNI_IFNAME"],
		Args:          vals["CNI_ARGS"],
		Path:          vals["CNI_PATH"],
		NetnsOverride: vals["CNI_NETNS_OVERRIDE"],
		StdinData:     stdin,
	}
	fn := map[string]verbFunc{"ADD": funcs.Add, "CHECK": funcs.Check, "DEL": funcs.Del, "GC": funcs.GC, "STATUS": funcs.Status}[cmd]
	// The lowest config version each verb exists in.
	if since := map[string]string{"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}[cmd]; since != "" {
		ok, err := cniversion.GreaterThanOrEqualTo(head.version, since)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, err.Error(), "")
		}
		if !ok {
			return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("config version does not allow %s", cmd), "")
		}
		supported := false
		for _, v := range versions.SupportedVersions() {
			ge, err := cniversion.GreaterThanOrEqualTo(v, head.version)
			if err != nil {
				return types.NewError(types.ErrDecodingFailure, err.Error(), "")
			}
			if ge {
				supported = true
				break
			}
		}
		if !supported {
			return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("plugin version does not allow %s", cmd), "")
		}
	}
	if !contains(versions.SupportedVersions(), head.version) {
		return types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions",
			fmt.Sprintf("config is %q, plugin supports %q", head.version, versions.SupportedVersions()))
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

// header is what the protocol layer reads of the config.
type header struct{ name, version string }

// configHead decodes the config's name and cniVersion ("0.1.0" when
// absent) and checks the name, as skel does before any verb. One decode
// when the config is well formed; a malformed one is decoded the way skel
// does it, field by field, so the error is the one skel would give (and
// without withVersion, for a verb skel does not know, only the name is).
func configHead(stdin []byte, withVersion bool) (header, *types.Error) {
	var h struct {
		Name       string `json:"name"`
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(stdin, &h); err != nil {
		var n struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(stdin, &n); err != nil {
			return header{}, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("error unmarshall network config: %v", err), "")
		}
		if terr := checkNetworkName(n.Name); terr != nil || !withVersion {
			return header{}, terr
		}
		var v struct {
			CNIVersion string `json:"cniVersion"`
		}
		if err := json.Unmarshal(stdin, &v); err != nil {
			return header{}, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decoding version from network config: %v", err), "")
		}
		h.Name, h.CNIVersion = n.Name, v.CNIVersion
	} else if terr := checkNetworkName(h.Name); terr != nil {
		return header{}, terr
	}
	if h.CNIVersion == "" {
		h.CNIVersion = "0.1.0"
	}
	return header{name: h.Name, version: h.CNIVersion}, nil
}

func checkNetworkName(name string) *types.Error {
	if name == "" {
		return types.NewError(types.ErrInvalidNetworkConfig, "missing network name", "")
	}
	if !validName(name) {
		return types.NewError(types.ErrInvalidNetworkConfig, "invalid characters found in network name", name)
	}
	return nil
}

// validName: a letter or digit, then letters, digits, '_', '.' or '-'
// (the CNI rule for container IDs and network names).
func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return true
}

func validContainerID(id string) *types.Error {
	if !validName(id) {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "invalid characters in containerID", id)
	}
	return nil
}

// maxIfName is the longest interface name the kernel takes (IFNAMSIZ-1).
const maxIfName = 15

func validIfName(name string) *types.Error {
	switch {
	case len(name) > maxIfName:
		return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name is too long", fmt.Sprintf("interface name should be less than %d characters", maxIfName+1))
	case name == "." || name == "..":
		return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name is . or ..", "")
	}
	for _, r := range name {
		if r == '/' || r == ':' || isSpace(r) {
			return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name contains / or : or whitespace characters", "")
		}
	}
	return nil
}

// isSpace is unicode.IsSpace without the unicode tables.
func isSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
