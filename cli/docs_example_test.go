package cli

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// TestDocsResendExample runs the shell block of docs/channels.md#resend that follows the
// "resend-example" marker, line by line, against a real database: the documented example of a
// provider fake cannot rot. Two things differ from a person's run, both because tests share the
// machine: the fake listens on a free port rather than the documented one (the port is replaced in
// the commands and in a copy of the channels file), and the test's own DATABASE_URL is used.
func TestDocsResendExample(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, _ := newCLI(t)
	lines := docBlock(t, "../docs/channels.md", "<!-- resend-example:")

	const documentedAddr = "127.0.0.1:17025"
	addr := freeAddr(t)
	channels, err := os.ReadFile("../testdata/channels/resend.toml")
	is.NoErr(err)
	is.True(strings.Contains(string(channels), "http://"+documentedAddr)) // the example file points at the documented fake
	channelsFile := filepath.Join(t.TempDir(), "resend.toml")
	is.NoErr(os.WriteFile(channelsFile, []byte(strings.ReplaceAll(string(channels), documentedAddr, addr)), 0o600))

	var extraEnv []string
	var fake *process
	var ran []string
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "export "):
			extraEnv = append(extraEnv, strings.TrimPrefix(line, "export "))
			continue
		case line == "kill %1":
			is.True(fake != nil)                    // the fake was started in the background
			is.Equal(fake.stop(syscall.SIGTERM), 0) // and stops cleanly
			continue
		}
		words := shellWords(t, line)
		is.True(len(words) > 0 && words[0] == "bin/notifier") // every other line runs the binary
		args := words[1:]
		for i, a := range args {
			args[i] = strings.ReplaceAll(strings.ReplaceAll(a, documentedAddr, addr), "testdata/channels/resend.toml", channelsFile)
		}
		ran = append(ran, args[0])
		if args[len(args)-1] == "&" {
			fake = c.startWithEnv(extraEnv, args[:len(args)-1]...)
			testworld.Eventually(t, 20*time.Second, "the fake's line", func() bool { return strings.HasSuffix(fake.stdout.String(), "\n") })
			var out fakeOutput
			is.NoErr(json.Unmarshal([]byte(fake.stdout.String()), &out))
			is.Equal(out.Resend, "http://"+addr) // the Resend fake listens where the channels file points
			continue
		}
		r := c.runWithEnv(extraEnv, args...)
		if r.code != 0 {
			t.Fatalf("%s: %s", line, r)
		}
		switch args[0] {
		case "work":
			var res service.Result
			decode(t, r.stdout, &res)
			is.Equal(res.Kind, service.ResultSent)          // as the docs say
			is.Equal(res.Channel, "email")                  // on the email channel
			is.Equal(res.Outcome, delivery.OutcomeAccepted) // accepted by the fake
		case "status":
			is.True(strings.Contains(r.stdout, "email")) // the task's channel
			is.True(strings.Contains(r.stdout, "SENT"))  // is SENT
		}
	}
	is.Equal(strings.Join(ran, " "), "fake pref create work status") // the example ran whole
	is.True(fake != nil && strings.Contains(fake.stderr.String(), "serving fakes"))
}

// docBlock returns the lines of the first fenced block after marker in the file.
func docBlock(t *testing.T, path, marker string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), marker)
	if !ok {
		t.Fatalf("%s: no %q marker", path, marker)
	}
	_, rest, _ = strings.Cut(rest, "```sh\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("%s: no shell block after %q", path, marker)
	}
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// shellWords splits a line as sh would for the forms the docs use: words, 'single quotes', and a
// trailing &. Anything else (double quotes, $, backslashes) fails the test: the docs must stay simple
// enough to be run here as written.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	if strings.ContainsAny(line, "\"$\\`;|<>") {
		t.Fatalf("doc line %q: uses shell syntax this test does not run", line)
	}
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("doc line %q: unterminated quote", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// freeAddr reserves a loopback port below the ephemeral range for the test's duration.
func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := pgtest.ReservePort()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Number))
}

// TestFakeProviders: `notifier fake --postmark ADDR` serves the Postmark fake with the token from the
// environment; a provider fake without its credential is a usage error that serves nothing.
func TestFakeProviders(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c := notifierCLI{t: t}
	for _, flag := range []string{"--resend", "--postmark"} {
		r := c.run("", "fake", flag, "127.0.0.1:0", "--resend-key-env", "UNSET_VARIABLE", "--postmark-token-env", "UNSET_VARIABLE")
		is.Equal(r.code, 2)    // usage
		is.Equal(r.stdout, "") // nothing served
		oneErrorLine(t, r)
	}
	p := c.startWithEnv([]string{"PM_FAKE_TOKEN=pm-fake-token"}, "fake", "--postmark", "127.0.0.1:0", "--postmark-token-env", "PM_FAKE_TOKEN")
	testworld.Eventually(t, 20*time.Second, "the fake's line", func() bool { return strings.HasSuffix(p.stdout.String(), "\n") })
	var out fakeOutput
	is.NoErr(json.Unmarshal([]byte(p.stdout.String()), &out))
	is.True(strings.HasPrefix(out.Postmark, "http://127.0.0.1:")) // the Postmark fake listens
	req, err := http.NewRequest(http.MethodPost, out.Postmark+"/email",
		strings.NewReader(`{"From":"a@example.com","To":"b@example.com","TextBody":"hi","Metadata":{"notifier_ref":"task-1"}}`))
	is.NoErr(err)
	req.Header.Set("X-Postmark-Server-Token", "pm-fake-token")
	resp, err := http.DefaultClient.Do(req)
	is.NoErr(err)
	resp.Body.Close()
	is.Equal(resp.StatusCode, http.StatusOK) // and accepts with the token
	is.Equal(p.stop(syscall.SIGTERM), 0)
}
