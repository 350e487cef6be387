package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nftmesh/nftmesh/redirect"
)

func TestCLITrace(t *testing.T) {
	pods := filepath.Join("..", "..", "testdata", "pods")
	tproxy := redirect.AnnotationInterceptionMode + "=TPROXY"
	cases := []struct {
		name    string
		args    []string
		verdict string
	}{
		{"app out", []string{"--pod", filepath.Join(pods, "injected.yaml"), "out", "10.0.0.5:443"}, "redirect :15001"},
		{"proxy out", []string{"--pod", filepath.Join(pods, "injected.yaml"), "--uid", "1337", "out", "10.0.0.5:443"}, "accept"},
		{"proxy gid out", []string{"--defaults", "--gid", "1337", "out", "10.0.0.5:443"}, "accept"},
		{"excluded range", []string{"-a", redirect.AnnotationExcludeOutboundIPRanges + "=10.0.0.0/8", "out", "10.0.0.5:443"}, "accept"},
		{"udp out", []string{"--defaults", "--proto", "udp", "out", "10.0.0.5:443"}, "accept"},
		{"dns", []string{"--defaults", "--dns-capture", "--proto", "udp", "out", "10.96.0.10:53"}, "redirect :15053"},
		{"inbound", []string{"--defaults", "in", "10.1.0.2:8080"}, "redirect :15006"},
		{"inbound 15021", []string{"--defaults", "in", "10.1.0.2:15021"}, "accept"},
		{"inbound tproxy", []string{"-a", tproxy, "in", "10.1.0.2:8080"}, "tproxy :15006 mark 1337"},
		{"inbound on an excluded interface", []string{"-a", redirect.AnnotationExcludeInterfaces + "=net1", "--iface", "net1", "in", "10.1.0.2:8080"}, "accept"},
		{"proxy to loopback pod address", []string{"--defaults", "--uid", "1337", "--iface", "lo", "--src", "10.1.0.2", "out", "10.1.0.2:8080"}, "redirect :15006"},
		{"validation probe", []string{"--defaults", "--uid", "1337", "out", "127.0.0.6:15002"}, "redirect :15006"},
		{"ipv6 without ipv6 rules", []string{"--defaults", "out", "[2001:db8::5]:443"}, "accept"},
		{"ipv6 with --ipv6", []string{"--defaults", "--ipv6", "out", "[2001:db8::5]:443"}, "redirect :15001"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, append([]string{"trace"}, c.args...)...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if last := lines[len(lines)-1]; last != "verdict: "+c.verdict {
				t.Errorf("last line %q, want %q\n%s", last, "verdict: "+c.verdict, out)
			}
			if c.verdict != "accept" && !strings.Contains(out, "<== decides") {
				t.Errorf("no deciding rule marked:\n%s", out)
			}
			code, out, errOut = runCLI(t, append([]string{"trace", "-o", "json"}, c.args...)...)
			if code != exitOK {
				t.Fatalf("-o json: exit %d: %s", code, errOut)
			}
			var doc struct {
				VerdictText   string `json:"verdictText"`
				SchemaVersion int    `json:"schemaVersion"`
				Steps         []redirect.TraceStep
			}
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatalf("-o json is not JSON: %v\n%s", err, out)
			}
			if doc.VerdictText != c.verdict || doc.SchemaVersion != schemaVersion {
				t.Errorf("json verdict %q, want %q", doc.VerdictText, c.verdict)
			}
		})
	}
	code, out, errOut := runCLI(t, "trace", "--pod", filepath.Join(pods, "interception-none.yaml"), "out", "10.0.0.5:443")
	if code != exitNotInMesh || out != "" || !strings.Contains(errOut, "not in the mesh: interceptionMode NONE") {
		t.Errorf("trace of a NONE pod: exit %d out %q err %q", code, out, errOut)
	}
}

func TestCLITraceBadInput(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		mention []string
	}{
		{"no args", []string{"--defaults"}, []string{"direction", "DST_IP:PORT"}},
		{"one arg", []string{"--defaults", "out"}, []string{"got 1"}},
		{"three args", []string{"--defaults", "out", "10.0.0.1:80", "x"}, []string{"got 3"}},
		{"bad direction", []string{"--defaults", "up", "10.0.0.1:80"}, []string{"direction", `"up"`}},
		{"no port", []string{"--defaults", "out", "10.0.0.1"}, []string{"destination", `"10.0.0.1"`}},
		{"port zero", []string{"--defaults", "out", "10.0.0.1:0"}, []string{"destination", "port 0"}},
		{"port too big", []string{"--defaults", "out", "10.0.0.1:65536"}, []string{"destination", `"10.0.0.1:65536"`}},
		{"name not ip", []string{"--defaults", "out", "example.com:80"}, []string{"destination", `"example.com:80"`}},
		{"v6 without brackets", []string{"--defaults", "out", "2001:db8::1:80"}, []string{"destination", "brackets"}},
		{"zone", []string{"--defaults", "out", "[fe80::1%eth0]:80"}, []string{"destination", "zone"}},
		{"mapped", []string{"--defaults", "out", "[::ffff:10.0.0.1]:80"}, []string{"destination", "IPv4-mapped"}},
		{"bad proto", []string{"--defaults", "--proto", "sctp", "out", "10.0.0.1:80"}, []string{"--proto", `"sctp"`}},
		{"upper proto", []string{"--defaults", "--proto", "TCP", "out", "10.0.0.1:80"}, []string{"--proto", `"TCP"`}},
		{"bad uid", []string{"--defaults", "--uid", "app", "out", "10.0.0.1:80"}, []string{"--uid", `"app"`}},
		{"negative gid", []string{"--defaults", "--gid", "-1", "out", "10.0.0.1:80"}, []string{"--gid", `"-1"`}},
		{"uid too big", []string{"--defaults", "--uid", "4294967296", "out", "10.0.0.1:80"}, []string{"--uid", `"4294967296"`}},
		{"uid inbound", []string{"--defaults", "--uid", "1", "in", "10.0.0.1:80"}, []string{"--uid", "out only"}},
		{"gid inbound", []string{"--defaults", "--gid", "1", "in", "10.0.0.1:80"}, []string{"--gid", "out only"}},
		{"bad src", []string{"--defaults", "--src", "10.0.0", "out", "10.0.0.1:80"}, []string{"--src", `"10.0.0"`}},
		{"src family", []string{"--defaults", "--src", "::1", "out", "10.0.0.1:80"}, []string{"--src", `"::1"`, "family"}},
		{"iface too long", []string{"--defaults", "--iface", "averyveryverylongname", "out", "10.0.0.1:80"}, []string{"--iface", `"averyveryverylongname"`}},
		{"iface slash", []string{"--defaults", "--iface", "a/b", "in", "10.0.0.1:80"}, []string{"--iface", `"a/b"`}},
		{"bad output", []string{"--defaults", "-o", "yaml", "out", "10.0.0.1:80"}, []string{"--output", `"yaml"`}},
		{"no spec", []string{"out", "10.0.0.1:80"}, []string{"no capture settings"}},
		{"bad annotation", []string{"-a", redirect.AnnotationIncludeInboundPorts + "=0", "in", "10.0.0.1:80"}, []string{redirect.AnnotationIncludeInboundPorts, `"0"`}},
		{"unknown source needed", []string{"-a", redirect.AnnotationInterceptionMode + "=TPROXY", "--defaults=false", "--uid", "1337", "--iface", "lo", "out", "10.1.0.2:8080"}, []string{"--src"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, append([]string{"trace"}, c.args...)...)
			if code != exitUsage {
				t.Fatalf("exit %d (want %d): out %q err %q", code, exitUsage, out, errOut)
			}
			if out != "" {
				t.Errorf("usage error printed to stdout: %q", out)
			}
			for _, m := range c.mention {
				if !strings.Contains(errOut, m) {
					t.Errorf("error %q does not mention %s", errOut, m)
				}
			}
		})
	}
}

// FuzzParseTrace: any direction, destination and flags give a packet or an
// error naming what was wrong, never a panic, and an accepted packet is one
// the tracer takes.
func FuzzParseTrace(f *testing.F) {
	f.Add("out", "10.0.0.1:80", "1000", "1000", "", "", "tcp")
	f.Add("in", "[2001:db8::1]:443", "0", "0", "2001:db8::2", "eth0", "udp")
	f.Add("out", "[fe80::1%eth0]:1", "-1", "x", "10.0.0", "a/b", "TCP")
	f.Add("sideways", "1.2.3.4:0", "4294967296", "", "::ffff:1.2.3.4", "averyveryverylongname", "")
	f.Fuzz(func(t *testing.T, dir, dst, uid, gid, src, iface, proto string) {
		in := traceInput{dir: dir, dst: dst, uid: uid, gid: gid, src: src, iface: iface, proto: proto}
		pkt, err := parseTrace(in)
		if err != nil {
			msg := err.Error()
			if len(msg) > 2048 || !utf8.ValidString(msg) {
				t.Fatalf("unbounded or invalid error: %.200q", msg)
			}
			return
		}
		fillTraceDefaults(&pkt, nil)
		p, berr := redirect.Build(redirect.DefaultSpec())
		if berr != nil {
			t.Fatal(berr)
		}
		if _, err := redirect.TracePacket(&p, pkt); err != nil && !strings.Contains(err.Error(), "source address") {
			t.Fatalf("accepted %+v but the tracer refuses it: %v", in, err)
		}
	})
}
