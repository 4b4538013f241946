package fastpath

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/rtcedge/rtcedge/internal/encap"
)

// TestLayout: every Go struct the maps are read and written through has
// the size and field offsets of its C type in the objects' BTF, and the
// C layout agrees with internal/encap and with this package's tables.
func TestLayout(t *testing.T) {
	spec, err := loadFastpath()
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{
		"gr_flow": fastpathGrFlow{}, "gr_flow_key": fastpathGrFlowKey{}, "gr_worker": fastpathGrWorker{},
		"fp_addr4": fastpathFpAddr4{}, "fp_key": fastpathFpKey{}, "fp_key_id": fastpathFpKeyId{},
		"cr_config": fastpathCrConfig{}, "fp_count": fastpathFpCount{},
	} {
		var s *btf.Struct
		if err := spec.Types.TypeByName(name, &s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		gt := reflect.TypeOf(v)
		var fields []reflect.StructField
		for i := range gt.NumField() {
			if f := gt.Field(i); f.Name != "_" { // structs.HostLayout
				fields = append(fields, f)
			}
		}
		if uintptr(s.Size) != gt.Size() || len(s.Members) != len(fields) {
			t.Fatalf("%s: C %d bytes, %d fields; Go %d bytes, %d fields", name, s.Size, len(s.Members), gt.Size(), len(fields))
		}
		for i, m := range s.Members {
			f := fields[i]
			if uintptr(m.Offset.Bytes()) != f.Offset || !strings.EqualFold(strings.ReplaceAll(m.Name, "_", ""), f.Name) {
				t.Errorf("%s: C field %s at %d, Go %s at %d", name, m.Name, m.Offset.Bytes(), f.Name, f.Offset)
			}
		}
	}
	if n := len(fastpathGrFlow{}.Hdr); n != encap.MinLen-encap.TagLen {
		t.Errorf("flow header template %d bytes, encap's IPv4 header without tag %d", n, encap.MinLen-encap.TagLen)
	}
	if n := reflect.TypeOf(fastpathFpKey{}).Size(); n != encap.KeyLen {
		t.Errorf("key %d bytes, encap.KeyLen %d", n, encap.KeyLen)
	}
	if m := spec.Maps["fp_stats"]; m.MaxEntries != NumReasons || len(Reasons) != NumReasons {
		t.Errorf("fp_stats has %d slots (FP_NREASONS), Go knows %d reasons", m.MaxEntries, NumReasons)
	}
}

// TestObjectsFresh: the committed objects were generated from the C
// sources as they are (`make bpf` records their hash; `make lint` checks
// it too).
func TestObjectsFresh(t *testing.T) {
	sums, err := os.ReadFile(filepath.Join("bpf", "sources.sha256"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		want, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("bpf/sources.sha256: bad line %q", line)
		}
		b, err := os.ReadFile(filepath.Join("bpf", name))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != want {
			t.Errorf("bpf/%s changed since the objects were generated: run `make bpf` and commit the result", name)
		}
	}
}
