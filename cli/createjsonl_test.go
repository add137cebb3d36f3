package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
)

// jsonlLine is one line of create --jsonl's output.
type jsonlLine struct {
	Line           int    `json:"line"`
	NotificationID int64  `json:"notification_id"`
	Created        bool   `json:"created"`
	Error          string `json:"error"`
	Tasks          []struct {
		TaskID  int64  `json:"task_id"`
		Channel string `json:"channel"`
	} `json:"tasks"`
}

func parseJSONL(t *testing.T, out string) []jsonlLine {
	t.Helper()
	var lines []jsonlLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var r jsonlLine
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("output line %q: %v", l, err)
		}
		lines = append(lines, r)
	}
	return lines
}

func event(user, key, body string) string {
	b, _ := json.Marshal(map[string]string{"user": user, "event_key": key, "body": body})
	return string(b)
}

func writeFile(t *testing.T, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Bad lines are refused by line number and cost only themselves; duplicates within the file (in one
// batch and across batches) are answered created=false with the first line's notification.
func TestCreateJSONLRefusesBadLinesAndDedupes(t *testing.T) {
	is := is.New(t)
	c, pool := newCLI(t)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "d1")
	c.ok("pref", "set", "--user", "u1", "--channel", "sms", "--address", "+1555")
	var lines []string
	bad := map[int]string{}
	for i := 1; i <= 700; i++ {
		switch i {
		case 5:
			lines, bad[i] = append(lines, `{"user":"u1","event_key":`), "not a JSON event"
		case 6:
			lines, bad[i] = append(lines, `{"user":"u1","event_key":"e6","body":"a\u0000b"}`), "NUL"
		case 7:
			lines, bad[i] = append(lines, event("u1", "e7", strings.Repeat("x", 65<<10))), "more than the limit"
		case 8:
			lines, bad[i] = append(lines, event("u1", "e8", strings.Repeat("é", 600<<10))), "line longer than"
		case 9:
			lines, bad[i] = append(lines, `{"user":"u1","event_key":"e9","body":"b","priority":1}`), "unknown field"
		case 10:
			lines, bad[i] = append(lines, `{"user":"u1","event_key":"e10","body":"b","ttl":"soon"}`), "invalid ttl"
		case 11:
			lines, bad[i] = append(lines, `{"event_key":"e11","body":"b"}`), "invalid user"
		case 12:
			lines = append(lines, event("u1", "e1", "a duplicate in the same batch"))
		case 650:
			lines = append(lines, event("u1", "e2", "a duplicate in a later batch"))
		default:
			lines = append(lines, event("u1", fmt.Sprintf("e%d", i), fmt.Sprintf("body %d", i)))
		}
	}
	r := c.run("", "create", "--jsonl", writeFile(t, lines), "--batch-size", "300")
	is.Equal(r.code, 2)                                   // some lines were refused
	is.True(strings.Contains(r.stderr, "7 of 700 lines")) // said once, with the count
	out := parseJSONL(t, r.stdout)
	is.Equal(len(out), 700) // one result per line
	byKey := map[int]jsonlLine{}
	for i, o := range out {
		is.Equal(o.Line, i+1) // in input order
		byKey[o.Line] = o
		if why, ok := bad[o.Line]; ok {
			if !strings.Contains(o.Error, why) {
				t.Errorf("line %d: error %q, want it to say %q", o.Line, o.Error, why)
			}
			continue
		}
		is.Equal(o.Error, "")     // submitted
		is.Equal(len(o.Tasks), 2) // push and sms
	}
	is.True(byKey[1].Created && !byKey[12].Created)              // within a batch: the first line wins
	is.Equal(byKey[12].NotificationID, byKey[1].NotificationID)  // and the other gets its notification
	is.True(byKey[2].Created && !byKey[650].Created)             // across batches too
	is.Equal(byKey[650].NotificationID, byKey[2].NotificationID) //
	is.Equal(byKey[650].Tasks, byKey[2].Tasks)                   // and its tasks
	var n, bodies int64
	is.NoErr(pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE body LIKE 'a duplicate%') FROM notification`).Scan(&n, &bodies))
	is.Equal(n, int64(700-7-2)) // every valid event once, nothing of the refused lines
	is.Equal(bodies, int64(0))  // the first body won
}

// Concurrent runs of the same file, and single creates of some of its events at the same time: every
// event exists once, and exactly one submission of each reported created=true (R1).
func TestCreateJSONLConcurrentRunsCreateOnce(t *testing.T) {
	is := is.New(t)
	c, pool := newCLI(t)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "d1")
	var lines []string
	for i := range 400 {
		lines = append(lines, event("u1", fmt.Sprintf("e%d", i), "body"))
	}
	path := writeFile(t, lines)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created = map[string]int{}
	)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := c.run("", "create", "--jsonl", path, "--batch-size", "50")
			if r.code != 0 {
				t.Errorf("create --jsonl: %s", r)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, o := range parseJSONL(t, r.stdout) {
				if o.Created {
					created[fmt.Sprintf("e%d", o.Line-1)]++
				}
			}
		}()
	}
	for i := 0; i < 400; i += 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := c.run("", "create", "--user", "u1", "--event-key", fmt.Sprintf("e%d", i), "--body", "body")
			var o createOutput
			decode(t, r.stdout, &o)
			if o.Created {
				mu.Lock()
				created[fmt.Sprintf("e%d", i)]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	is.Equal(len(created), 400) // every event was created...
	for key, n := range created {
		if n != 1 {
			t.Errorf("%s: created=true %d times", key, n) // ...by exactly one submission
		}
	}
	var n int64
	is.NoErr(pool.QueryRow(context.Background(), `SELECT count(*) FROM notification`).Scan(&n))
	is.Equal(n, int64(400))
}

// The database stops in the middle of a file: create --jsonl exits 1 having printed only what
// committed, and a rerun of the same file ends with every event exactly once. Not parallel: it stops
// the cluster the package's tests share.
func TestCreateJSONLRerunAfterADatabaseRestart(t *testing.T) {
	if pgtest.Cluster() == nil {
		t.Skip("needs the harness's own cluster (TEST_DATABASE_URL points elsewhere)")
	}
	is := is.New(t)
	c, pool := newCLI(t)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "d1")
	var lines []string
	for i := range 500 {
		lines = append(lines, event("u1", fmt.Sprintf("e%d", i), "body"))
	}

	cmd := c.command(context.Background(), "create", "--jsonl", "-", "--batch-size", "100")
	stdin, err := cmd.StdinPipe()
	is.NoErr(err)
	stdout, err := cmd.StdoutPipe()
	is.NoErr(err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	is.NoErr(cmd.Start())
	results := bufio.NewScanner(stdout)
	for _, l := range lines[:200] {
		_, err := fmt.Fprintln(stdin, l)
		is.NoErr(err)
	}
	for range 200 { // two batches committed: their results are out
		is.True(results.Scan())
	}
	is.NoErr(pgtest.Cluster().Stop()) // the database goes away mid-file
	for _, l := range lines[200:] {
		_, _ = fmt.Fprintln(stdin, l)
	}
	_ = stdin.Close()
	var after int
	for results.Scan() {
		after++
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	is.True(err != nil && errors.As(err, &exit) && exit.ExitCode() == 1)      // a runtime failure
	is.Equal(after, 0)                                                        // nothing printed for what did not commit
	is.True(strings.Contains(stderr.String(), "lines 201-300 not submitted")) // it says where it stopped
	is.NoErr(pgtest.Cluster().Start(context.Background()))

	r := c.run("", "create", "--jsonl", writeFile(t, lines), "--batch-size", "100")
	is.Equal(r.code, 0) // the rerun
	out := parseJSONL(t, r.stdout)
	is.Equal(len(out), 500)
	for _, o := range out {
		is.Equal(o.Created, o.Line > 200) // the first 200 were in already
	}
	pool.Reset()
	var n, tasks int64
	is.NoErr(pool.QueryRow(context.Background(), `SELECT count(*), (SELECT count(*) FROM delivery_task) FROM notification`).Scan(&n, &tasks))
	is.Equal(n, int64(500))     // every event exactly once
	is.Equal(tasks, int64(500)) // with its one task
}
