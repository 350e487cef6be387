package imagebuild

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fakeELF is the smallest file debug/elf reads as a linux executable for
// machine, with a PT_INTERP program header when dynamic.
func fakeELF(t *testing.T, machine elf.Machine, dynamic bool) []byte {
	t.Helper()
	const ehsize, phentsize = 64, 56
	h := elf.Header64{
		Type:      uint16(elf.ET_EXEC),
		Machine:   uint16(machine),
		Version:   uint32(elf.EV_CURRENT),
		Ehsize:    ehsize,
		Phentsize: phentsize,
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	h.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	h.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	var progs []elf.Prog64
	if dynamic {
		h.Phoff = ehsize
		progs = append(progs, elf.Prog64{Type: uint32(elf.PT_INTERP)})
	}
	h.Phnum = uint16(len(progs))
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, h); err != nil {
		t.Fatal(err)
	}
	for _, p := range progs {
		if err := binary.Write(&buf, binary.LittleEndian, p); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestNftmeshImage(t *testing.T) {
	bins := Binaries{
		Agent:      append(fakeELF(t, elf.EM_X86_64, false), "agent"...),
		Plugin:     append(fakeELF(t, elf.EM_X86_64, false), "plugin"...),
		Standalone: append(fakeELF(t, elf.EM_X86_64, false), "standalone"...),
		Redirect:   append(fakeELF(t, elf.EM_X86_64, false), "redirect"...),
	}
	meta := Meta{Version: "v0.3.0", Revision: "0123abcd", Created: time.Unix(1700000000, 0), Architecture: "amd64"}
	img, err := Nftmesh(bins, meta)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !reflect.DeepEqual(c.Entrypoint, []string{AgentPath}) || c.User != "0:0" || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("config %+v on %s/%s: want entrypoint %s, user 0:0, linux/amd64", c, cf.OS, cf.Architecture, AgentPath)
	}
	want := map[string]string{
		"org.opencontainers.image.version":  "v0.3.0",
		"org.opencontainers.image.revision": "0123abcd",
		"org.opencontainers.image.source":   DefaultSource,
		"org.opencontainers.image.created":  "2023-11-14T22:13:20Z",
	}
	for k, v := range want {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}

	// Exactly the four binaries, where the Dockerfile puts them.
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v (%v), want one", layers, err)
	}
	files, err := Layer([]File{
		{Path: AgentPath, Mode: 0o755, Data: bins.Agent},
		{Path: PluginPath, Mode: 0o755, Data: bins.Plugin},
		{Path: StandalonePath, Mode: 0o755, Data: bins.Standalone},
		{Path: RedirectPath, Mode: 0o755, Data: bins.Redirect},
	}, meta.Created)
	if err != nil {
		t.Fatal(err)
	}
	diffID, _ := layers[0].DiffID()
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got bytes.Buffer
	if _, err := got.ReadFrom(rc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), files) {
		t.Errorf("the layer (%v) is not the four binaries at their paths", diffID)
	}
}

func TestNftmeshRefusesBinariesThatCannotStart(t *testing.T) {
	static := fakeELF(t, elf.EM_X86_64, false)
	cases := []struct {
		name string
		bins Binaries
		meta Meta
		want string
	}{
		{"no version", Binaries{static, static, static, static}, Meta{Architecture: "amd64"}, "the version is empty"},
		{"not ELF", Binaries{static, []byte("#!/bin/sh\n"), static, static}, Meta{Version: "v1", Architecture: "amd64"},
			PluginPath + ": not an ELF binary"},
		{"other architecture", Binaries{fakeELF(t, elf.EM_AARCH64, false), static, static, static}, Meta{Version: "v1", Architecture: "amd64"},
			AgentPath + ": built for EM_AARCH64, the image is amd64"},
		{"dynamic", Binaries{static, static, static, fakeELF(t, elf.EM_X86_64, true)}, Meta{Version: "v1", Architecture: "amd64"},
			RedirectPath + ": dynamically linked"},
		{"no companion", Binaries{Agent: static, Plugin: static, Redirect: static}, Meta{Version: "v1", Architecture: "amd64"},
			StandalonePath + ": not an ELF binary"},
		{"unknown arch", Binaries{static, static, static, static}, Meta{Version: "v1", Architecture: "vax"}, `architecture "vax" is not supported`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Nftmesh(tc.bins, tc.meta)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Nftmesh: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := Nftmesh(Binaries{static, static, static, static}, Meta{Version: "v1", Architecture: "amd64"}); err != nil {
		t.Errorf("static amd64 binaries refused: %v", err)
	}
}
