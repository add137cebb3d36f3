package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"
	"go.yaml.in/yaml/v3"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
)

// What ships for Prometheus and Grafana (docs/operations.md#alerts-and-dashboard).
const (
	rulesFile     = "deploy/prometheus/notifier-rules.yml"
	dashboardFile = "deploy/grafana/notifier.json"
)

// metricsExporter starts something that serves Prometheus metrics on the test's database and returns
// the address of its /metrics (host:port).
type metricsExporter struct {
	name  string
	start func(t *testing.T, c notifierCLI, pool *pgxpool.Pool) string
}

// metricsExporters are the processes whose metrics the rules and the dashboard may name. Another one
// is one more line here.
var metricsExporters = []metricsExporter{
	{"notifier work", startMeasuredWorker},
	{"notifier console", startMeasuredConsole},
}

// startMeasuredConsole runs `notifier console --metrics-addr 127.0.0.1:0` under the operator role with
// a users file and returns its metrics address once it serves (its counters start at 0 for every label,
// so each name is exposed before anyone signs in). The console is stopped at the end of the test.
func startMeasuredConsole(t *testing.T, c notifierCLI, pool *pgxpool.Pool) string {
	t.Helper()
	p := c.loginAs(pool, service.RoleOperator).start("--log-format", "json", "console", "--listen", "127.0.0.1:0",
		"--users-file", consoleUsers(t, "pw-of-alice"), "--metrics-addr", "127.0.0.1:0")
	t.Cleanup(func() { p.stop(syscall.SIGTERM) })
	consoleURL(t, p) // it serves its pages too
	addr := metricsAddr(t, p)
	body := scrape(t, "http://"+addr+"/metrics")
	is.New(t).True(strings.Contains(body, `notifier_console_sign_ins_total{result="wrong_password"} 0`)) // its counters start at 0
	return addr
}

// TestAlertRulesAndDashboardNameExportedMetrics: every metric an alert rule's expr or a dashboard
// panel's query names is one that a running notifier exports (the rules would otherwise never fire,
// and the panel stay empty, without anyone noticing). Each exporter runs on a real database with a
// fake channel and is scraped once it has made a call (counters with labels appear at their first
// sample; histograms count under name_bucket, name_sum and name_count). up is Prometheus's own.
func TestAlertRulesAndDashboardNameExportedMetrics(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	named := map[string][]string{} // metric -> where it is named
	for _, q := range ruleExprs(t) {
		for _, name := range promqlMetricNames(q.expr) {
			named[name] = append(named[name], q.where)
		}
	}
	for _, q := range dashboardExprs(t) {
		for _, name := range promqlMetricNames(q.expr) {
			named[name] = append(named[name], q.where)
		}
	}
	is.True(len(named) >= 15) // the parser found the metrics (the rules and panels name about twenty)

	c, pool := newCLI(t)
	exported := map[string]bool{"up": true}
	for _, e := range metricsExporters {
		addr := e.start(t, c, pool)
		for name := range exposedMetricNames(scrape(t, "http://"+addr+"/metrics")) {
			exported[name] = true
		}
	}
	missing := unexported(named, exported)
	for _, m := range missing {
		t.Error(m)
	}
	is.Equal(len(missing), 0) // every metric named is exported
}

// startMeasuredWorker runs `notifier work --metrics-addr 127.0.0.1:0` under the worker role on push (a
// fake that accepts), with one task to deliver, and returns its metrics address once it has called the
// channel and its gauges have been read. It checks the fleet-wide gauges against what it seeded: one
// parked push task (parked two hours ago), one FAILED task a receipt contradicts, one sms task due an
// hour ago that no worker serves, sms's rate-limit bucket paused for an hour, and sms paused for an
// account state since 10 minutes ago. The worker is stopped at the end of the test.
func startMeasuredWorker(t *testing.T, c notifierCLI, pool *pgxpool.Pool) string {
	t.Helper()
	is := is.New(t)
	ctx := context.Background()
	push := startFake(t, fakes.Push)
	parkedTaskSince(t, pool, 2*time.Hour)
	_, err := pool.Exec(ctx, `
		INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'push', 'device-1') ON CONFLICT DO NOTHING;
		INSERT INTO notification (user_id, event_key, body, expires_at)
			SELECT 'u1', e, 'shipped', now() + interval '1 day' FROM unnest(ARRAY['deliver', 'written-off', 'waiting']) AS e;
		INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
			SELECT id, CASE event_key WHEN 'deliver' THEN 'push' ELSE 'sms' END, 3,
			       CASE event_key WHEN 'waiting' THEN now() - interval '1 hour' ELSE now() END
			FROM notification WHERE event_key IN ('deliver', 'waiting');
		INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, next_attempt_at)
			SELECT id, 'sms', 'FAILED', 3, 3, NULL FROM notification WHERE event_key = 'written-off';
		INSERT INTO delivery_receipt (task_id, source, event_id, kind, effect)
			SELECT t.id, 'twilio', 'late-1', 'DELIVERED', 'CONTRADICTS' FROM delivery_task t
			JOIN notification n ON n.id = t.notification_id WHERE n.event_key = 'written-off';
		INSERT INTO channel_rate_limit (channel, rate, burst, tokens, paused_until)
			VALUES ('sms', 1, 1, 0, now() + interval '1 hour');
		INSERT INTO channel_pause (channel, cause, paused_at, backoff_seconds, probe_after, probe_hold_seconds)
			VALUES ('sms', '401 code 20003: Authenticate', now() - interval '10 minutes', 300, now() + interval '5 minutes', 30)`)
	is.NoErr(err) // the seeded tasks, receipt, bucket and account pause

	p := c.loginAs(pool, "notifier_worker").start("--log-format", "json", "work", "--channel", "push=idempotent,"+push.URL(),
		"--poll", "50ms", "--metrics-addr", "127.0.0.1:0")
	t.Cleanup(func() { p.stop(syscall.SIGTERM) })
	addr := metricsAddr(t, p)
	var body string
	testworld.Eventually(t, 30*time.Second, "the push task delivered and a claim after it", func() bool {
		body = scrape(t, "http://"+addr+"/metrics")
		return metricValue(body, `notifier_calls_total{action="SEND",channel="push",outcome="ACCEPTED"}`) == 1 &&
			metricValue(body, "notifier_worker_last_claim_timestamp_seconds") > 0
	})
	if strings.Contains(p.stderr.String(), "could not read the fleet-wide gauges") {
		t.Fatalf("the worker role could not read the gauges:\n%s", p.stderr)
	}
	is.Equal(metricValue(body, "notifier_tasks_parked"), 1.0)                                   // the parked task
	is.True(metricValue(body, "notifier_tasks_parked_oldest_age_seconds") >= 2*3600)            // parked two hours ago
	is.True(metricValue(body, "notifier_tasks_due_oldest_age_seconds") >= 3600)                 // the sms task nobody serves
	is.Equal(metricValue(body, "notifier_tasks_late_accepted"), 1.0)                            // the receipt contradicts the write-off
	is.True(metricValue(body, `notifier_rate_limit_paused_seconds{channel="sms"}`) > 3000)      // sms paused for about an hour
	is.True(metricValue(body, `notifier_channel_account_paused_seconds{channel="sms"}`) >= 600) // and for its account, 10 minutes ago
	is.True(metricValue(body, "notifier_fleet_gauges_refreshed_timestamp_seconds") > 1.7e9)     // read, at a Unix time
	is.True(strings.Contains(body, `notifier_set_aside_total{channel="push"} 0`))               // its channels' counters start at 0
	is.True(strings.Contains(body, `notifier_finish_total{result="UNRECORDED"} 0`))             // and every result's
	is.True(!strings.Contains(p.stderr.String(), `"level":"ERROR"`))                            // nothing went wrong
	return addr
}

// exposedMetricNames are the metric names a Prometheus text exposition offers to queries: each family
// with samples (a # TYPE line), and for a histogram or summary its _bucket, _sum and _count series.
func exposedMetricNames(body string) map[string]bool {
	names := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		names[f[2]] = true
		switch f[3] {
		case "histogram":
			names[f[2]+"_bucket"], names[f[2]+"_sum"], names[f[2]+"_count"] = true, true, true
		case "summary":
			names[f[2]+"_sum"], names[f[2]+"_count"] = true, true
		}
	}
	return names
}

// unexported lists, sorted, each named metric that is not exported, with where it is named.
func unexported(named map[string][]string, exported map[string]bool) []string {
	var missing []string
	for name, where := range named {
		if !exported[name] {
			missing = append(missing, fmt.Sprintf("%s is named by %s but no exporter serves it", name, strings.Join(where, ", ")))
		}
	}
	slices.Sort(missing)
	return missing
}

// namedExpr is one PromQL expression and where it comes from.
type namedExpr struct{ where, expr string }

// ruleExprs are the exprs of every rule in rulesFile.
func ruleExprs(t *testing.T) []namedExpr {
	t.Helper()
	var file struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Record, Expr string
				Annotations         map[string]string
			}
		}
	}
	readYAML(t, rulesFile, &file)
	var out []namedExpr
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			out = append(out, namedExpr{rulesFile + " " + r.Alert + r.Record, r.Expr})
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no rules", rulesFile)
	}
	return out
}

// dashboardExprs are the queries of every panel's targets in dashboardFile.
func dashboardExprs(t *testing.T) []namedExpr {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ RefID, Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []namedExpr
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			out = append(out, namedExpr{fmt.Sprintf("%s panel %q %s", dashboardFile, p.Title, q.RefID), q.Expr})
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no panel queries", dashboardFile)
	}
	return out
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

var (
	promqlStringRe   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlMatchersRe = regexp.MustCompile(`\{[^}]*\}`)
	promqlRangeRe    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGroupingRe = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	grafanaVarRe     = regexp.MustCompile(`\$\{[^}]*\}|\$\w+`)
	promqlIdentRe    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promqlWords      = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"group_left": true, "group_right": true, "inf": true, "nan": true, "Inf": true, "NaN": true}
)

// promqlMetricNames are the metric names a PromQL expression selects, in order, each once: what is left
// of it without strings, label matchers, ranges, grouping clauses, Grafana's variables, functions and
// keywords.
func promqlMetricNames(expr string) []string {
	for _, re := range []*regexp.Regexp{promqlStringRe, promqlMatchersRe, promqlRangeRe, promqlGroupingRe, grafanaVarRe} {
		expr = re.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, at := range promqlIdentRe.FindAllStringIndex(expr, -1) {
		name := expr[at[0]:at[1]]
		gluedToNumber := at[0] > 0 && strings.ContainsAny(expr[at[0]-1:at[0]], "0123456789.") // 1e9, 0.5
		function := strings.HasPrefix(strings.TrimLeft(expr[at[1]:], " \t\n"), "(")
		if gluedToNumber || function || promqlWords[name] || slices.Contains(names, name) {
			continue
		}
		names = append(names, name)
	}
	return names
}

// TestPromqlMetricNames: the parser behind TestAlertRulesAndDashboardNameExportedMetrics finds the
// metrics of the shapes the rules and panels use and nothing else, and a misspelt metric is reported.
func TestPromqlMetricNames(t *testing.T) {
	is := is.New(t)
	for expr, want := range map[string][]string{
		`histogram_quantile(0.99, sum by (le, channel) (rate(notifier_call_duration_seconds_bucket{job="$job"}[$__rate_interval])))`: {"notifier_call_duration_seconds_bucket"},
		`max without (instance) (notifier_tasks_late_accepted - min_over_time(notifier_tasks_late_accepted[1h])) > 0`:                {"notifier_tasks_late_accepted"},
		`notifier_database_standbys > 0 and notifier_database_commits_wait_for_standby == 0`:                                         {"notifier_database_standbys", "notifier_database_commits_wait_for_standby"},
		`time() - notifier_worker_last_claim_timestamp_seconds > 1e2 or absent(up{job="notifier", x=~"a{1}"})`:                       {"notifier_worker_last_claim_timestamp_seconds", "up"},
		`sum(rate(a_total[5m] offset 1h)) / on (channel) group_left (x) b`:                                                           {"a_total", "b"},
		`label_replace(c, "dst", "$1", "src", "(.*)")`:                                                                               {"c"},
	} {
		is.Equal(promqlMetricNames(expr), want) // the metrics of expr
	}
	missing := unexported(map[string][]string{"notifier_parkd_total": {"a rule"}, "up": {"a panel"}}, map[string]bool{"up": true})
	is.Equal(missing, []string{"notifier_parkd_total is named by a rule but no exporter serves it"}) // a typo is caught
	names := exposedMetricNames("# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\n# TYPE g gauge\ng 1\n")
	is.Equal(names, map[string]bool{"h": true, "h_bucket": true, "h_sum": true, "h_count": true, "g": true}) // a histogram's series
}

// TestDashboardQueriesParse: every panel query of the dashboard is valid PromQL (promtool check rules on
// each as a recording rule, Grafana's $__rate_interval and $job filled in). It needs promtool (Debian's
// prometheus: sh internal/tools/install-debs prometheus; CI installs it).
func TestDashboardQueriesParse(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (sh internal/tools/install-debs prometheus)")
	}
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, q := range dashboardExprs(t) {
		expr := strings.NewReplacer("$__rate_interval", "5m", "$job", "notifier", "$console_job", "notifier-console").Replace(q.expr)
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: expr})
	}
	out, err := yaml.Marshal(map[string]any{"groups": []map[string]any{{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if msg, err := exec.CommandContext(ctx, promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, msg)
	}
}

// TestAlertRunbooksResolve: every rule has a summary, a description and a runbook_url pointing at a
// heading of docs/operations.md.
func TestAlertRunbooksResolve(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	docs, err := os.ReadFile(filepath.Join(repoRoot(t), "docs/operations.md"))
	is.NoErr(err)
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(docs), "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			anchors[githubSlug(h)] = true
		}
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert       string
				Annotations map[string]string
			}
		}
	}
	readYAML(t, rulesFile, &file)
	const prefix = "https://github.com/notifierhq/notifier/blob/main/docs/operations.md#"
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			a := r.Annotations
			if a["summary"] == "" || a["description"] == "" {
				t.Errorf("%s: wants a summary and a description", r.Alert)
			}
			anchor, ok := strings.CutPrefix(a["runbook_url"], prefix)
			if !ok || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q is not %s<a heading of docs/operations.md>", r.Alert, a["runbook_url"], prefix)
			}
		}
	}
}

// repoRoot is the module's root (tests run in their package's directory).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := pgtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// githubSlug is a heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to "-".
func githubSlug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
