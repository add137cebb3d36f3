package console

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
)

// The browser tests drive the console in headless Chromium (Debian's chromium package, installed by
// sh internal/tools/install-debs chromium). Without it they skip, unless NOTIFIER_REQUIRE_BROWSER is set
// (.ci/run sets it). NOTIFIER_UPDATE_SCREENSHOT=1 rewrites docs/console.png from the list page.

// findChromium is $NOTIFIER_CHROMIUM, else the first browser found in PATH.
func findChromium() string {
	if p := os.Getenv("NOTIFIER_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// newBrowser starts one headless browser for t and its subtests.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := findChromium()
	if path == "" {
		const why = "no chromium in PATH (sh internal/tools/install-debs chromium)"
		if os.Getenv("NOTIFIER_REQUIRE_BROWSER") != "" {
			t.Fatal(why + "; NOTIFIER_REQUIRE_BROWSER is set: failing instead of skipping")
		}
		t.Skip(why)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.WindowSize(1280, 760),
		chromedp.DisableGPU, chromedp.Flag("lang", "en-US"))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to start its sandbox as root (CI runs as root)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browser, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	if err := chromedp.Do(browser); err != nil { // starts the browser, with no timeout: it lives for the test
		t.Fatalf("start %s: %v", path, err)
	}
	return browser
}

// newTab opens a tab in a browser context of its own: its own cookies, as another person's browser.
func newTab(t *testing.T, browser context.Context) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(tab); err != nil {
		t.Fatal(err)
	}
	return tab
}

// do runs steps in tab, bounded so that a page that never shows what a step waits for fails the test.
func do(t *testing.T, tab context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

func get[T any](t *testing.T, tab context.Context, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// signIn fills and posts the sign-in form and waits for the signed-in header.
func signIn(t *testing.T, tab context.Context, base, user, password string) {
	t.Helper()
	do(t, tab,
		chromedp.Navigate(base+"/login"),
		chromedp.SendKeys(chromedp.ID("user"), user),
		chromedp.SendKeys(chromedp.ID("password"), password),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("operator")),
	)
}

// browserFixture is a console served over plain HTTP on 127.0.0.1 with Secure cookies, as
// notifier console --listen 127.0.0.1:PORT serves it: the browser must keep them on loopback.
func browserFixture(t *testing.T) (*fixture, string) {
	f := newFixture(t, nil)
	ts := httptest.NewServer(f.srv.Handler())
	t.Cleanup(ts.Close)
	return f, ts.URL
}

func TestBrowser(t *testing.T) {
	browser := newBrowser(t)

	t.Run("unauthenticated is redirected to sign-in", func(t *testing.T) {
		is := is.New(t)
		f, base := browserFixture(t)
		id := f.parkedTask("push", "u1", "hello")
		tab := newTab(t, browser)
		do(t, tab, chromedp.Navigate(base+"/task/"+strconv.FormatInt(id, 10)), chromedp.WaitVisible(chromedp.ID("signin")))
		is.Equal(get(t, tab, chromedp.Location()), base+"/login")
		is.True(!strings.Contains(get(t, tab, chromedp.OuterHTML(chromedp.CSS("html"))), "hello")) // nothing of the task shown
	})

	t.Run("wrong password is refused", func(t *testing.T) {
		is := is.New(t)
		_, base := browserFixture(t)
		tab := newTab(t, browser)
		do(t, tab,
			chromedp.Navigate(base+"/login"),
			chromedp.SendKeys(chromedp.ID("user"), "alice"),
			chromedp.SendKeys(chromedp.ID("password"), bobPassword),
			chromedp.Click(chromedp.ID("signin")),
			chromedp.WaitVisible(chromedp.ID("error")),
		)
		is.Equal(get(t, tab, chromedp.Text(chromedp.ID("error"))), "Wrong user name or password.")
		do(t, tab, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("signin")))
		is.Equal(get(t, tab, chromedp.Location()), base+"/login") // still signed out
	})

	t.Run("sign in and see a parked task with its attempts", func(t *testing.T) {
		is := is.New(t)
		f, base := browserFixture(t)
		id := f.parkedTask("sms", "user-42", "Your code is 1234")
		tab := newTab(t, browser)
		signIn(t, tab, base, "alice", alicePassword)
		row := chromedp.ID("task-" + strconv.FormatInt(id, 10))
		do(t, tab, chromedp.WaitVisible(row))
		text := get(t, tab, chromedp.Text(row))
		for _, want := range []string{"PARKED", "sms", "user-42", "SEND:TIMEOUT", "Your code is 1234"} {
			is.True(strings.Contains(text, want)) // the row shows it
		}
		do(t, tab, chromedp.Click(chromedp.CSS("#task-"+strconv.FormatInt(id, 10)+" a")), chromedp.WaitVisible(chromedp.ID("attempts")))
		attempts := get(t, tab, chromedp.Text(chromedp.ID("attempts")))
		is.True(strings.Contains(attempts, "SEND:TIMEOUT"))
		is.True(strings.Contains(attempts, "worker-a"))
		is.True(strings.Contains(attempts, "no answer within 10s"))
		is.True(strings.Contains(attempts, "10s")) // the latency
	})

	t.Run("a body with script is shown as text", func(t *testing.T) {
		is := is.New(t)
		f, base := browserFixture(t)
		const body = `<script>document.title="pwned"</script><img src=x id=injected>`
		id := f.parkedTask("email", "u1", body)
		tab := newTab(t, browser)
		signIn(t, tab, base, "alice", alicePassword)
		do(t, tab, chromedp.WaitVisible(chromedp.ID("task-"+strconv.FormatInt(id, 10))))
		is.Equal(get(t, tab, chromedp.TextContent(chromedp.CSS("#task-"+strconv.FormatInt(id, 10)+" pre.body"))), body)
		do(t, tab, chromedp.Navigate(base+"/task/"+strconv.FormatInt(id, 10)), chromedp.WaitVisible(chromedp.ID("body")))
		is.Equal(get(t, tab, chromedp.TextContent(chromedp.ID("body"))), body) // the markup as text
		is.Equal(get(t, tab, chromedp.Evaluate[int](`document.querySelectorAll("script, #injected").length`)), 0)
		is.True(get(t, tab, chromedp.Title()) != "pwned")
	})

	t.Run("resolve and the task leaves the list", func(t *testing.T) {
		is := is.New(t)
		f, base := browserFixture(t)
		id, other := f.parkedTask("push", "u1", "first"), f.parkedTask("push", "u2", "second")
		tab := newTab(t, browser)
		signIn(t, tab, base, "alice", alicePassword)
		do(t, tab,
			chromedp.WaitVisible(chromedp.ID("task-"+strconv.FormatInt(id, 10))),
			chromedp.Navigate(base+"/task/"+strconv.FormatInt(id, 10)),
			chromedp.SendKeys(chromedp.ID("note"), "Delivered per the FCM console"),
			chromedp.Click(chromedp.ID("resolve-sent")),
			chromedp.WaitVisible(chromedp.ID("notice")),
		)
		is.Equal(get(t, tab, chromedp.Text(chromedp.ID("notice"))), "Task "+strconv.FormatInt(id, 10)+" resolved as SENT.")
		is.Equal(get(t, tab, chromedp.Evaluate[bool](`document.getElementById("task-`+strconv.FormatInt(id, 10)+`") === null`)), true) // gone
		do(t, tab, chromedp.WaitVisible(chromedp.ID("task-"+strconv.FormatInt(other, 10))))                                            // the other stays
		is.Equal(f.task(id), taskRow{state: "SENT", manual: 1, operator: "alice", note: "Delivered per the FCM console"})
	})

	t.Run("a concurrent second resolve is shown as already resolved", func(t *testing.T) {
		is := is.New(t)
		f, base := browserFixture(t)
		id := f.parkedTask("push", "u1", "hello")
		alice, bob := newTab(t, browser), newTab(t, browser)
		signIn(t, alice, base, "alice", alicePassword)
		signIn(t, bob, base, "bob", bobPassword)
		page := base + "/task/" + strconv.FormatInt(id, 10)
		// Both open the parked task with its forms; alice resolves first, then bob posts his.
		do(t, alice, chromedp.Navigate(page), chromedp.WaitVisible(chromedp.ID("resolve-sent")))
		do(t, bob, chromedp.Navigate(page), chromedp.WaitVisible(chromedp.ID("resolve-failed")))
		do(t, alice,
			chromedp.SendKeys(chromedp.ID("note"), "seen delivered"),
			chromedp.Click(chromedp.ID("resolve-sent")),
			chromedp.WaitVisible(chromedp.ID("notice")),
		)
		do(t, bob,
			chromedp.SendKeys(chromedp.ID("note"), "looks failed to me"),
			chromedp.Click(chromedp.ID("resolve-failed")),
			chromedp.WaitVisible(chromedp.ID("error")),
		)
		msg := get(t, bob, chromedp.Text(chromedp.ID("error")))
		is.True(strings.Contains(msg, "Nothing changed: task "+strconv.FormatInt(id, 10)+" was already resolved by alice at "))
		is.True(strings.Contains(msg, "(MANUAL_SENT)"))
		is.Equal(get(t, bob, chromedp.Evaluate[bool](`document.getElementById("resolve") === null`)), true) // no form any more
		is.Equal(f.task(id), taskRow{state: "SENT", manual: 1, operator: "alice", note: "seen delivered"})  // bob changed nothing
	})

	t.Run("a form posted without its CSRF token is refused", func(t *testing.T) {
		is := is.New(t)
		f, base := browserFixture(t)
		id := f.parkedTask("push", "u1", "hello")
		tab := newTab(t, browser)
		signIn(t, tab, base, "alice", alicePassword)
		do(t, tab,
			chromedp.Navigate(base+"/task/"+strconv.FormatInt(id, 10)),
			chromedp.WaitVisible(chromedp.ID("resolve")),
			chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				_, err := chromedp.Evaluate[bool](`document.querySelector('#resolve input[name="csrf"]').remove(), true`)(ctx, tg)
				return err
			}),
			chromedp.SendKeys(chromedp.ID("note"), "seen delivered"),
			chromedp.Click(chromedp.ID("resolve-sent")),
			chromedp.WaitVisible(chromedp.ID("error")),
		)
		is.True(strings.Contains(get(t, tab, chromedp.Text(chromedp.ID("error"))), "did not carry this session's token"))
		is.Equal(f.task(id), taskRow{state: "UNKNOWN", needsReview: true}) // nothing changed
	})

	t.Run("list page screenshot", func(t *testing.T) {
		is := is.New(t)
		f, base := browserFixture(t)
		f.parkedTask("push", "user-1042", "Your order #88231 has shipped and arrives Tuesday.")
		f.parkedTask("sms", "user-77", "Your sign-in code is 482913. It expires in 10 minutes.")
		f.parkedTask("email", "user-3310", "Invoice INV-2026-0412 is ready: 129.00 EUR due on 15 December.")
		tab := newTab(t, browser)
		signIn(t, tab, base, "alice", alicePassword)
		do(t, tab, chromedp.WaitVisible(chromedp.ID("tasks")))
		png := get(t, tab, chromedp.CaptureScreenshot())
		is.True(len(png) > 1000)
		if os.Getenv("NOTIFIER_UPDATE_SCREENSHOT") != "1" {
			return
		}
		root, err := pgtest.RepoRoot()
		is.NoErr(err)
		is.True(len(png) < 200<<10) // small enough to show on the front page
		is.NoErr(os.WriteFile(filepath.Join(root, "docs", "console.png"), png, 0o644))
	})
}
