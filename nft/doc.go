// Package nft is the nftables backend: it programs a redirect.Plan into a
// network namespace over netlink (google/nftables, one batch per Apply, one
// private "inet nftmesh" table), reads it back into redirect vocabulary,
// removes it, and renders a Plan as `nft -f` text.
//
// It owns the table, the TPROXY policy routes (fwmark → table 133) and the
// ::6/128 passthrough address on lo. It does not decide what the rules are
// (that is redirect.Build), does not enter namespaces by switching threads for
// nftables, and never runs the nft binary.
package nft
