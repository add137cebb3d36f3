package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

const testWebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func writeChannels(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "channels.toml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runWithEnv runs the binary with extra environment variables.
func (c notifierCLI) runWithEnv(extra []string, args ...string) result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := c.command(ctx, args...)
	cmd.Env = append(cmd.Env, extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		c.t.Fatalf("notifier %s: %v", strings.Join(args, " "), err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// TestWorkChannelsFile: `work --once --channels FILE` serves the channels of a TOML file; a secret
// named by secret_env comes from the process environment.
func TestWorkChannelsFile(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	c, pool := newCLI(t)
	push := startFake(t, fakes.Push)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	_, err := n.SetPreference(ctx, "u1", "push", "device-1", true)
	is.NoErr(err) // preference
	_, _, tasks, err := n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "order-1", Body: "shipped", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)           // notification
	is.Equal(len(tasks), 1) // one task

	file := writeChannels(t, `
[channels.push]
kind = "http"
mode = "idempotent"
url = "`+push.URL()+`"
idempotency_window = "24h"

[channels.hooks]
kind = "webhook"
secret_env = "NOTIFIER_TEST_HOOK_SECRET"
`)
	r := c.runWithEnv([]string{"NOTIFIER_TEST_HOOK_SECRET=" + testWebhookSecret}, "work", "--once", "--worker-id", "w1", "--channels-file", file)
	is.Equal(r.code, 0) // the worker ran
	var res service.Result
	decode(t, r.stdout, &res)
	is.Equal(res.Kind, service.ResultSent)          // delivered
	is.Equal(res.TaskID, tasks[0].TaskID)           // the task
	is.Equal(res.Channel, "push")                   // through the channel from the file
	is.Equal(res.Outcome, delivery.OutcomeAccepted) // accepted
	is.Equal(push.TotalSends(), 1)                  // one call to the fake

	// Without the variable the same file is refused at start.
	r = c.run("", "work", "--once", "--channels-file", file)
	is.Equal(r.code, 2) // bad configuration
	oneErrorLine(t, r)
	is.True(strings.Contains(r.stderr, `channel "hooks": secret_env: environment variable NOTIFIER_TEST_HOOK_SECRET is unset or empty`)) // names channel, key and variable
}

// TestWorkChannelsConfigErrors: a bad channels file exits 2 with one line naming the channel and
// the key, and nothing is claimed or sent.
func TestWorkChannelsConfigErrors(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	push := startFake(t, fakes.Push)
	n := service.NewNotifier(pool)
	ctx := context.Background()
	_, err := n.SetPreference(ctx, "u1", "push", "device-1", true)
	is.New(t).NoErr(err) // preference
	_, _, _, err = n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "due-1", Body: "body", TTL: time.Hour, MaxAttempts: 3})
	is.New(t).NoErr(err) // a due task a worker could claim
	before := rowCounts(t, pool)
	pushTable := "[channels.push]\nkind = \"http\"\nmode = \"idempotent\"\nurl = \"" + push.URL() + "\"\n"

	cases := []struct {
		name  string
		toml  string
		extra []string // more arguments
		want  []string
	}{
		{"smtp claims idempotent", pushTable + "[channels.email]\nkind = \"smtp\"\nmode = \"idempotent\"\naddr = \"smtp.example:587\"\nfrom = \"a@example.com\"\n",
			nil, []string{"invalid --channels", `channel "email"`, `mode "idempotent"`}},
		{"inline password", pushTable + "[channels.email]\nkind = \"smtp\"\naddr = \"smtp.example:587\"\nfrom = \"a@example.com\"\nusername = \"u\"\npassword = \"hunter2\"\n",
			nil, []string{`channel "email"`, "secrets only from password_env/password_file"}},
		{"ses without configuration_set", pushTable + "[channels.email]\nkind = \"ses\"\nregion = \"eu-west-1\"\nfrom = \"a@example.com\"\n",
			nil, []string{`channel "email"`, "configuration_set: required"}},
		{"unknown key", pushTable + "retries = 5\n", nil, []string{`channel "push"`, `unknown key "retries"`}},
		{"defined twice", pushTable, []string{"--channel", "push=idempotent," + push.URL()}, []string{`channel "push"`, "also defined in --channels"}},
		{"bad allowed_networks", pushTable + "[channels.hooks]\nkind = \"webhook\"\nsecret_env = \"PATH\"\nallowed_networks = [\"127.0.0.0/8\", \"10.0.0.0/33\"]\n",
			nil, []string{`channel "hooks"`, `allowed_networks: "10.0.0.0/33" is not a CIDR network`}},
		{"allowed_networks on an operator's url", pushTable + "allowed_networks = [\"10.0.0.0/8\"]\n",
			nil, []string{`channel "push"`, `allowed_networks does not apply to kind "http"`}},
		{"syntax error", "[channels.push\n", nil, []string{"invalid --channels", "channels.toml"}},
		{"postmark retention", pushTable + "[channels.email]\nkind = \"postmark\"\nserver_token_env = \"PM_TOKEN\"\nfrom = \"a@example.com\"\nretention = \"3d\"\n",
			nil, []string{`channel "email"`, `retention "3d"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			args := append([]string{"work", "--once", "--channels-file", writeChannels(t, tc.toml)}, tc.extra...)
			r := c.in(t).run("", args...)
			is.Equal(r.code, 2) // bad configuration
			oneErrorLine(t, r)  // one line
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Fatalf("stderr %q does not contain %q", r.stderr, w)
				}
			}
			is.True(!strings.Contains(r.stderr, "hunter2")) // never a secret
			is.Equal(r.stdout, "")                          // no result
		})
	}
	is := is.New(t)
	r := c.run("", "work", "--once", "--channels-file", filepath.Join(t.TempDir(), "missing.toml"))
	is.Equal(r.code, 2)                                 // a missing file is bad input
	is.True(strings.Contains(r.stderr, "missing.toml")) // named
	is.Equal(rowCounts(t, pool), before)                // nothing written
	is.Equal(push.TotalSends(), 0)                      // nothing sent
}
