package iptables

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nftmesh/nftmesh/redirect"
)

// Render prints the Plan's rules for one family in iptables-save syntax,
// exactly as iptables-legacy-save (FamilyIPv4) or ip6tables-legacy-save
// (FamilyIPv6) prints a fresh network namespace after Apply, minus the
// "# Generated/Completed" comment lines; a family with no rules renders as
// "". Tables come in the Plan's order (mangle, nat, raw), as Apply makes a
// fresh namespace list them (see ourTables); where a table already existed
// the order of whole tables may differ, each table's text does not.
func Render(p redirect.Plan, family redirect.Family) (string, error) {
	tables, err := lowerPlan(p, family)
	if err != nil {
		return "", fmt.Errorf("rendering plan for %s: %w", family, err)
	}
	var b strings.Builder
	for _, t := range tables {
		renderTable(&b, t, family)
	}
	return b.String(), nil
}

func renderTable(b *strings.Builder, t xtable, fam redirect.Family) {
	fmt.Fprintf(b, "*%s\n", t.name)
	for _, c := range t.chains {
		if c.builtin {
			fmt.Fprintf(b, ":%s %s [0:0]\n", c.name, strings.ToUpper(c.policy.String()))
		} else {
			fmt.Fprintf(b, ":%s - [0:0]\n", c.name)
		}
	}
	for _, c := range t.chains {
		for _, r := range c.rules {
			b.WriteString("-A ")
			b.WriteString(c.name)
			r.save(b, fam)
			b.WriteByte('\n')
		}
	}
	b.WriteString("COMMIT\n")
}

// save prints the rule after "-A CHAIN" the way iptables' print_rule4 /
// print_rule6 do: source, destination, interfaces, protocol, then the
// matches in order, then the target.
func (r xrule) save(b *strings.Builder, fam redirect.Family) {
	if r.src.IsValid() {
		fmt.Fprintf(b, "%s -s %s", bang(r.invSrc), r.src)
	}
	if r.dst.IsValid() {
		fmt.Fprintf(b, "%s -d %s", bang(r.invDst), r.dst)
	}
	if r.in != "" {
		fmt.Fprintf(b, "%s -i %s", bang(r.invIn), r.in)
	}
	if r.out != "" {
		fmt.Fprintf(b, "%s -o %s", bang(r.invOut), r.out)
	}
	if r.proto != 0 {
		fmt.Fprintf(b, "%s -p %s", bang(r.invProto), protoName(r.proto))
	}
	for _, m := range r.matches {
		m.save(b)
	}
	r.target.save(b, fam)
}

// bang is iptables' " !" before an inverted option.
func bang(inv bool) string {
	if inv {
		return " !"
	}
	return ""
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return strconv.Itoa(int(p))
}

func (m mPort) save(b *strings.Builder) {
	name, dir := "tcp", "--dport"
	if m.udp {
		name = "udp"
	}
	if m.src {
		dir = "--sport"
	}
	fmt.Fprintf(b, " -m %s%s %s %d", name, bang(m.inv), dir, m.port)
}

func (m mMultiport) save(b *strings.Builder) {
	dir := "--dports"
	if m.src {
		dir = "--sports"
	}
	ps := make([]string, len(m.ports))
	for i, p := range m.ports {
		ps[i] = strconv.Itoa(int(p))
	}
	fmt.Fprintf(b, " -m multiport%s %s %s", bang(m.inv), dir, strings.Join(ps, ","))
}

func (m mOwner) save(b *strings.Builder) {
	what := "--uid-owner"
	if m.gid {
		what = "--gid-owner"
	}
	fmt.Fprintf(b, " -m owner%s %s %d", bang(m.inv), what, m.id)
}

func (m mMark) save(b *strings.Builder) {
	name := "mark"
	if m.conn {
		name = "connmark"
	}
	fmt.Fprintf(b, " -m %s%s --mark 0x%x", name, bang(m.inv), m.value)
	if m.mask != 0xffffffff { // libxt_mark prints a mask that is not all ones
		fmt.Fprintf(b, "/0x%x", m.mask)
	}
}

// ctStateNames is libxt_conntrack's print order.
var ctStateNames = []struct {
	bit  redirect.CTState
	name string
}{
	{redirect.CTStateInvalid, "INVALID"},
	{redirect.CTStateNew, "NEW"},
	{redirect.CTStateRelated, "RELATED"},
	{redirect.CTStateEstablished, "ESTABLISHED"},
}

func (m mConntrack) save(b *strings.Builder) {
	var names []string
	for _, s := range ctStateNames {
		if m.states&s.bit != 0 {
			names = append(names, s.name)
		}
	}
	fmt.Fprintf(b, " -m conntrack%s --ctstate %s", bang(m.inv), strings.Join(names, ","))
}

func (m mComment) save(b *strings.Builder) {
	fmt.Fprintf(b, " -m comment --comment %s", saveString(m.text))
}

// saveString quotes like xtables_save_string: bare when only letters,
// digits, '-' and '_', else in double quotes with '"' and '\' escaped.
func saveString(s string) string {
	special := func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_')
	}
	if s != "" && !strings.ContainsFunc(s, special) {
		return s
	}
	return `"` + saveEscaper.Replace(s) + `"`
}

var saveEscaper = strings.NewReplacer(`"`, `\"`, `\`, `\\`)

var verdictNames = map[int32]string{verdictAccept: "ACCEPT", verdictDrop: "DROP", verdictReturn: "RETURN"}

func (t tVerdict) save(b *strings.Builder, _ redirect.Family) {
	if name, ok := verdictNames[t.v]; ok {
		b.WriteString(" -j " + name)
		return
	}
	fmt.Fprintf(b, " -j <verdict %d>", t.v)
}

func (t tJump) save(b *strings.Builder, _ redirect.Family) { b.WriteString(" -j " + t.chain) }

func (t tRedirect) save(b *strings.Builder, _ redirect.Family) {
	fmt.Fprintf(b, " -j REDIRECT --to-ports %d", t.port)
}

func (t tTProxy) save(b *strings.Builder, fam redirect.Family) {
	ip := "0.0.0.0"
	if fam == redirect.FamilyIPv6 {
		ip = "::"
	}
	fmt.Fprintf(b, " -j TPROXY --on-port %d --on-ip %s --tproxy-mark 0x%x/0x%x", t.port, ip, t.mark, t.mask)
}

func (t tMark) save(b *strings.Builder, _ redirect.Family) {
	fmt.Fprintf(b, " -j MARK --set-xmark 0x%x/0x%x", t.mark, t.mask)
}

func (t tConnmark) save(b *strings.Builder, _ redirect.Family) {
	switch t.mode {
	case xtConnmarkSave:
		fmt.Fprintf(b, " -j CONNMARK --save-mark --nfmask 0x%x --ctmask 0x%x", t.nfmask, t.ctmask)
	case xtConnmarkRestore:
		fmt.Fprintf(b, " -j CONNMARK --restore-mark --nfmask 0x%x --ctmask 0x%x", t.nfmask, t.ctmask)
	default:
		fmt.Fprintf(b, " -j CONNMARK --mode %d", t.mode)
	}
}

func (t tCT) save(b *strings.Builder, _ redirect.Family) { fmt.Fprintf(b, " -j CT --zone %d", t.zone) }
