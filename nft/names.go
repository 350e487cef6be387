package nft

import (
	"fmt"
	"strings"

	"github.com/nftmesh/nftmesh/redirect"
)

// TableName is the name of our private inet table.
const TableName = "nftmesh"

// ChainName maps a Plan table and chain to the nft chain name:
// nat/ISTIO_INBOUND → "nat-istio-inbound".
func ChainName(t redirect.TableName, chain string) string {
	// One allocation for the ASCII names every plan has (encoding a plan
	// names each chain twice and each jump once); anything else the long
	// way, which gives the same result.
	b := make([]byte, 0, len(t)+1+len(chain))
	for _, part := range [...]string{string(t), "-", chain} {
		for i := 0; i < len(part); i++ {
			c := part[i]
			switch {
			case c >= 0x80:
				return strings.ToLower(string(t) + "-" + strings.ReplaceAll(chain, "_", "-"))
			case c == '_':
				c = '-'
			case 'A' <= c && c <= 'Z':
				c += 'a' - 'A'
			}
			b = append(b, c)
		}
	}
	return string(b)
}

// splitChainName is the inverse of ChainName for the names we create.
func splitChainName(name string) (redirect.TableName, string, error) {
	t, c, ok := strings.Cut(name, "-")
	if !ok || c == "" {
		return "", "", fmt.Errorf("chain %q is not named <table>-<chain>", name)
	}
	switch tn := redirect.TableName(t); tn {
	case redirect.TableMangle, redirect.TableNat, redirect.TableRaw:
		return tn, strings.ToUpper(strings.ReplaceAll(c, "-", "_")), nil
	}
	return "", "", fmt.Errorf("chain %q names unknown table %q", name, t)
}

// checkChainName rejects Plan chain names that would not survive the
// round trip through ChainName (List could not give them back).
func checkChainName(t redirect.TableName, chain string) error {
	gt, gc, err := splitChainName(ChainName(t, chain))
	if err != nil {
		return err
	}
	if gt != t || gc != chain {
		return fmt.Errorf("chain %s/%s: name must be upper case with underscores to map to nft chain %q and back", t, chain, ChainName(t, chain))
	}
	return nil
}
