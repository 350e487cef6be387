package installer

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/rs/zerolog"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// istioLevels maps every level name an Istio log flag accepts to ours.
// nftmesh always reports its errors, so Istio's none and fatal become error.
var istioLevels = map[string]zerolog.Level{
	"debug":   zerolog.DebugLevel,
	"info":    zerolog.InfoLevel,
	"warn":    zerolog.WarnLevel,
	"warning": zerolog.WarnLevel,
	"error":   zerolog.ErrorLevel,
	"fatal":   zerolog.ErrorLevel,
	"none":    zerolog.ErrorLevel,
}

// maxLevelItem bounds the bytes of a bad value quoted in an error: quoting
// may spell each byte as four characters (\xNN), and an error names two.
const maxLevelItem = 24

// ParseLogLevel reads the level of the agent and the plugin: debug, info,
// warn (or warning), error, or Istio's scope form as its charts write it,
// scope:level pairs separated by commas (default:info,cni-plugin:debug),
// where an item without a scope stands for the default scope. nftmesh has
// one level for all of its logging, so the most verbose level named for any
// scope applies: whoever asked for debug on one scope sees debug lines.
func ParseLogLevel(s string) (zerolog.Level, error) {
	if strings.TrimSpace(s) == "" {
		return zerolog.NoLevel, fmt.Errorf("is empty")
	}
	best := zerolog.Disabled
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		scope, name, scoped := strings.Cut(item, ":")
		if !scoped {
			name, scope = scope, "default"
		}
		if !scopeName.MatchString(scope) {
			return zerolog.NoLevel, fmt.Errorf("item %s: scope %s is not a scope name (letters, digits, '-', '_', '.')", bound(item), bound(scope))
		}
		lvl, ok := istioLevels[strings.ToLower(strings.TrimSpace(name))]
		if !ok {
			return zerolog.NoLevel, fmt.Errorf("item %s: %s is not a level (want debug, info, warn, error, or Istio's fatal or none)", bound(item), bound(name))
		}
		best = min(best, lvl)
	}
	return best, nil
}

var scopeName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,64}$`)

// bound quotes a piece of a bad value for an error, bounded.
func bound(s string) string { return quote.ValueN(s, maxLevelItem) }
