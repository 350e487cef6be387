package nft

import (
	"fmt"
	"strings"

	"github.com/nftmesh/nftmesh/redirect"
)

// TableName is the name of our private inet table.
const TableName = "nftmesh"

// ChainName maps a Plan table and chain to the nft chain name:
// nat/ISTIO_INBOUND → "nat-istio-inbound". The model owns the mapping
// (redirect.ChainName), so the CLI names a chain as this table does.
func ChainName(t redirect.TableName, chain string) string { return redirect.ChainName(t, chain) }

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
