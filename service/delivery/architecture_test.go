package delivery_test

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The layout docs/architecture.md draws: service/ is notifier on PostgreSQL; every package below it
// (the domain vocabulary, the channel adapters, channelconfig, receipts, httpkit, redact, and any
// provider adapter added later) builds without the database driver and never imports its parent, so
// an adapter can be read, tested and reused without PostgreSQL.
func TestSubPackagesNeitherImportTheirParentNorTheDriver(t *testing.T) {
	const parent = "github.com/notifierhq/notifier/service"
	out, err := exec.Command("go", "list", "-deps=false", "-json", parent+"/...").Output()
	if err != nil {
		t.Skipf("go list: %v (the go command is needed for this test)", err)
	}
	type pkg struct {
		ImportPath string
		Deps       []string
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	checked := 0
	for _, p := range pkgs {
		if p.ImportPath == parent {
			continue
		}
		checked++
		if p.ImportPath == parent+"/httpkit" && !slices.Contains(p.Deps, "net/http") {
			t.Fatalf("go list gave %s no net/http among its dependencies: the list is not being read", p.ImportPath)
		}
		for _, dep := range p.Deps {
			switch {
			case dep == parent:
				t.Errorf("%s depends on its parent %s", p.ImportPath, parent)
			case strings.HasPrefix(dep, "github.com/jackc/"), dep == "github.com/notifierhq/notifier/dbgen":
				t.Errorf("%s depends on the database: %s", p.ImportPath, dep)
			}
		}
	}
	if checked < 8 {
		t.Fatalf("checked %d sub-packages of service/; want every one (at least 8)", checked)
	}
}
