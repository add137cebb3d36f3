// Package docscheck keeps the documentation honest; it holds tests only. README.md is for users and
// must stay short; the depth lives in docs/, and the code cites it (docs/protocol.md#r3). Links rot
// silently when a heading is renamed or a file moves, so every run checks:
//
//   - every relative link in README.md and docs/**/*.md names an existing file, and every #anchor a
//     heading of its target (GitHub's slugs);
//   - README.md stays under readmeLimit bytes;
//   - every command, role and channel kind of the code is named in README.md or docs/ (names_test.go),
//     and no doc counts the roles wrong;
//   - every docs/<file>.md[#anchor] or README.md[#anchor] cited in Go, SQL, shell scripts or the
//     justfile resolves, and every rule R<n> cited there is defined in docs/protocol.md (a heading
//     "R<n>", anchor r<n>).
//
// Older citations of a SPEC outside the repository or of README sections ("SPEC section 7",
// README "bench") are listed with their replacement (legacyCitations); go test -v shows them, and
// -docscheck.strict fails on them once the code has been moved over.
package docscheck

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
)

var strict = flag.Bool("docscheck.strict", true, "fail on citations of the SPEC or of README sections left in code (=false to list them only)")

// readmeLimit is the README's budget: what a user reads before using the tool. Depth goes to docs/.
const readmeLimit = 15 * 1024

// legacyCitations maps the citations the code used before docs/ existed to where each is defined now;
// a citation of the old kind that comes back is reported with its replacement.
var legacyCitations = []struct{ old, now string }{
	{`SPEC section 4`, "docs/protocol.md#create"},
	{`SPEC sections 5 and 6`, "docs/protocol.md#claim-time-decisions"}, // and docs/protocol.md#action-choice
	{`SPEC section 5`, "docs/protocol.md#claim"},
	{`SPEC section 6`, "docs/protocol.md#action-choice"},
	{`SPEC section 7`, "docs/protocol.md#finish"},
	{`SPEC section 9`, "docs/testing.md#seed-cases"},
	{`SPEC section 10`, "docs/protocol.md#known-boundaries"},
	{`SPEC P1`, "docs/testing.md#seed-cases"},
	{`SPEC P2`, "docs/testing.md#seed-cases"},
	{`"Channel protocol"`, "docs/channels.md#channel-protocol"},
	{`"Real channels"`, "docs/channels.md#real-channels"},
	{`"Running against your own database"`, "docs/operations.md#pgbouncer-and-prepared-statements"},
	{`"What limits throughput here"`, "docs/benchmarks.md#what-limits-throughput-here"},
	{`README "bench"`, "docs/benchmarks.md#the-load-bench"},
	{`"Retention and the River peer"`, "docs/benchmarks.md#the-river-peer"},
	{`README's first command`, "README.md#quick-start"},
	{`README's figures`, "docs/benchmarks.md#the-machine"},
}

func TestMarkdownLinksResolve(t *testing.T) {
	is := is.New(t)
	root := repoRoot(t)
	files := markdownFiles(t, root)
	is.True(len(files) > 1)                           // README.md and docs/ are found
	is.Equal(brokenLinks(root, files), []string(nil)) // every relative link and #anchor resolves
}

func TestReadmeStaysShort(t *testing.T) {
	is := is.New(t)
	info, err := os.Stat(filepath.Join(repoRoot(t), "README.md"))
	is.NoErr(err) // README.md exists
	t.Logf("README.md: %d of %d bytes", info.Size(), readmeLimit)
	is.True(info.Size() <= readmeLimit) // README.md over its budget: move depth into docs/
}

func TestCodeCitationsResolve(t *testing.T) {
	is := is.New(t)
	root := repoRoot(t)
	broken, legacy := checkCode(root)
	for _, l := range legacy {
		t.Log("legacy citation: " + l)
	}
	is.Equal(broken, []string(nil)) // every docs/ path, #anchor and rule R<n> cited in code is defined
	if *strict {
		is.Equal(legacy, []string(nil)) // no citation of the SPEC or of a README section is left in code
	}
}

func TestLegacyCitationTargetsResolve(t *testing.T) {
	is := is.New(t)
	root := repoRoot(t)
	var broken []string
	for _, c := range legacyCitations {
		if p := resolveCitation(root, c.now); p != "" {
			broken = append(broken, c.old+" -> "+p)
		}
	}
	is.Equal(broken, []string(nil)) // every replacement of an old citation exists
}

func TestSlug(t *testing.T) {
	is := is.New(t)
	for heading, want := range map[string]string{
		"R3":                                 "r3",
		"The `notifier` command":             "the-notifier-command",
		"Claim: the first check (SPEC 5)":    "claim-the-first-check-spec-5",
		"PgBouncer and prepared statements":  "pgbouncer-and-prepared-statements",
		"What limits throughput here":        "what-limits-throughput-here",
		"[Web Push](https://x.example) keys": "web-push-keys",
		"snake_case and-dash":                "snake_case-and-dash",
		"Ours / River":                       "ours--river",
	} {
		is.Equal(slug(heading), want) // GitHub's anchor for the heading
	}
}

// TestCheckerFindsBrokenLinks is the negative control: the checks above pass only if they can fail.
func TestCheckerFindsBrokenLinks(t *testing.T) {
	is := is.New(t)
	root := t.TempDir()
	write(t, root, "README.md", "# Top\n\n## Same\n\n## Same\n\n"+
		"[ok](docs/a.md#usage) [ok](#same-1) [ok](docs/) [web](https://example.com/x.md#nothing)\n"+
		"[missing file](docs/gone.md) [missing anchor](docs/a.md#nope)\n"+
		"`[in code](docs/gone.md)`\n\n```\n[in a fence](docs/gone.md)\n# not a heading\n```\n")
	write(t, root, "docs/a.md", "# A\n\n## Usage\n\nBack to [top](../README.md#top), not to [here](#not-a-heading).\n")
	write(t, root, "x.go", "package x\n\n// See docs/a.md#usage and R2; docs/a.md#nope, R7, docs/b.md and SPEC section 7.\n")
	write(t, root, "docs/protocol.md", "# Protocol\n\n### R2\n")

	got := brokenLinks(root, markdownFiles(t, root))
	is.Equal(got, []string{
		`README.md:8: docs/gone.md: no such file`,
		`README.md:8: docs/a.md#nope: no heading "nope" in docs/a.md`,
		`docs/a.md:5: #not-a-heading: no heading "not-a-heading" in docs/a.md`,
	}) // exactly the broken links, none of the good ones, nothing in code

	broken, legacy := checkCode(root)
	is.Equal(broken, []string{
		`x.go:3: docs/a.md#nope: no heading "nope" in docs/a.md`,
		`x.go:3: docs/b.md: no such file`,
		`x.go:3: R7: not defined in docs/protocol.md (no heading "R7")`,
	}) // exactly the broken citations
	is.Equal(legacy, []string{`x.go:3: SPEC section 7 -> docs/protocol.md#finish`}) // the old citation, with its replacement
}

// ---- markdown ----

var (
	headingRe  = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$`)
	linkRe     = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRe   = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	codeSpanRe = regexp.MustCompile("``[^`]*``|`[^`]*`")
	mdLinkRe   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	schemeRe   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// doc is what the checks need of one markdown file.
type doc struct {
	anchors map[string]bool
	links   []link
}

type link struct {
	line   int
	target string
}

// parseMarkdown finds headings and link targets outside fenced code blocks and code spans.
func parseMarkdown(text string) doc {
	d := doc{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if m := headingRe.FindStringSubmatch(line); m != nil {
			s := slug(m[2])
			if n := seen[s]; n > 0 { // GitHub numbers repeated headings: same, same-1, same-2
				seen[s]++
				s = fmt.Sprintf("%s-%d", s, n)
			} else {
				seen[s] = 1
			}
			d.anchors[s] = true
		}
		plain := codeSpanRe.ReplaceAllString(line, "")
		for _, m := range linkRe.FindAllStringSubmatch(plain, -1) {
			d.links = append(d.links, link{i + 1, m[1]})
		}
		if m := refDefRe.FindStringSubmatch(plain); m != nil {
			d.links = append(d.links, link{i + 1, m[1]})
		}
	}
	return d
}

// slug is GitHub's anchor for a heading: its text lowercased, spaces to '-', punctuation dropped
// except '-' and '_'.
func slug(heading string) string {
	text := mdLinkRe.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// brokenLinks checks every relative link of files (paths relative to root).
func brokenLinks(root string, files []string) []string {
	var broken []string
	docs := map[string]doc{}
	for _, f := range files {
		for _, l := range loadDoc(root, f, docs).links {
			if l.target == "" || strings.HasPrefix(l.target, "//") || schemeRe.MatchString(l.target) {
				continue // another site: not ours to check
			}
			path, anchor, _ := strings.Cut(l.target, "#")
			target := f
			if path != "" {
				target = filepath.ToSlash(filepath.Join(filepath.Dir(f), path))
			}
			if p := checkTarget(root, target, anchor, docs); p != "" {
				broken = append(broken, fmt.Sprintf("%s:%d: %s: %s", f, l.line, l.target, p))
			}
		}
	}
	return broken
}

// checkTarget says what is wrong with a link to target (relative to root) and anchor, or "".
func checkTarget(root, target, anchor string, docs map[string]doc) string {
	if strings.HasPrefix(target, "../") || target == ".." {
		return "outside the repository"
	}
	info, err := os.Stat(filepath.Join(root, target))
	if err != nil {
		return "no such file"
	}
	if anchor == "" {
		return ""
	}
	if info.IsDir() || !strings.HasSuffix(target, ".md") {
		return "an anchor into a file that is not markdown"
	}
	if !loadDoc(root, target, docs).anchors[anchor] {
		return fmt.Sprintf("no heading %q in %s", anchor, target)
	}
	return ""
}

func loadDoc(root, file string, docs map[string]doc) doc {
	if d, ok := docs[file]; ok {
		return d
	}
	text, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		text = nil // reported by the caller's Stat, or by markdownFiles
	}
	d := parseMarkdown(string(text))
	docs[file] = d
	return d
}

// markdownFiles lists README.md and docs/**/*.md, relative to root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing docs/: %v", err)
	}
	return files
}

// ---- code ----

var (
	docCiteRe  = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:README\.md|docs/[A-Za-z0-9_./-]*\.md)(?:#[A-Za-z0-9_-]+)?)`)
	ruleCiteRe = regexp.MustCompile(`\bR([0-9]+)\b`)
	legacyRe   = regexp.MustCompile(`\bSPEC\b|\bREADME\b`)
)

// checkCode reads every Go, SQL and shell file and the justfile under root (but this package, whose
// table names the old citations) and returns the citations that do not resolve, and the legacy ones
// with their replacement.
func checkCode(root string) (broken, legacy []string) {
	docs := map[string]doc{}
	protocol := loadDoc(root, "docs/protocol.md", docs)
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			broken = append(broken, err.Error())
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if slices.Contains([]string{".git", ".tools", "node_modules", "bin", "internal/docscheck"}, rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, ".sql") && !strings.HasSuffix(rel, ".sh") && rel != "justfile" {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			broken = append(broken, err.Error())
			return nil
		}
		lines := strings.Split(string(text), "\n")
		for i, line := range lines {
			at := fmt.Sprintf("%s:%d: ", rel, i+1)
			// Cheap tests before each regular expression: under -race the expressions over every line of
			// the repository took 26 s, the tests first 3.
			if !strings.Contains(line, "README.md") && !strings.Contains(line, "docs/") && !mayCiteRule(line) &&
				!strings.Contains(line, "SPEC") && !strings.Contains(line, "README") {
				continue
			}
			for _, m := range docCiteRe.FindAllStringSubmatch(line, -1) {
				if p := resolveCitationIn(root, m[1], docs); p != "" {
					broken = append(broken, at+m[1]+": "+p)
				}
			}
			for _, m := range ruleCiteRe.FindAllStringSubmatch(line, -1) {
				if !protocol.anchors["r"+m[1]] {
					broken = append(broken, at+m[0]+": not defined in docs/protocol.md (no heading \""+m[0]+"\")")
				}
			}
			if legacyRe.MatchString(strings.ReplaceAll(line, "README.md", "")) {
				next := "" // a citation may run on into the next comment line
				if i+1 < len(lines) {
					next = strings.TrimLeft(lines[i+1], " \t/-#")
				}
				legacy = append(legacy, at+describeLegacy(strings.TrimRight(line, " ")+" "+next))
			}
		}
		return nil
	})
	return broken, legacy
}

// mayCiteRule reports whether line has an R followed by a digit, which every rule citation (R3) has.
func mayCiteRule(line string) bool {
	for i := strings.IndexByte(line, 'R'); i >= 0 && i+1 < len(line); {
		if c := line[i+1]; c >= '0' && c <= '9' {
			return true
		}
		j := strings.IndexByte(line[i+1:], 'R')
		if j < 0 {
			return false
		}
		i += 1 + j
	}
	return false
}

// describeLegacy names the old citation on line and its replacement, or quotes the line.
func describeLegacy(line string) string {
	for _, c := range legacyCitations {
		if strings.Contains(line, c.old) {
			return c.old + " -> " + c.now
		}
	}
	return "no replacement known: " + strings.TrimSpace(line)
}

// resolveCitation checks one citation, docs/<file>.md or README.md with an optional #anchor.
func resolveCitation(root, citation string) string {
	return resolveCitationIn(root, citation, map[string]doc{})
}

func resolveCitationIn(root, citation string, docs map[string]doc) string {
	path, anchor, _ := strings.Cut(citation, "#")
	return checkTarget(root, path, anchor, docs)
}

// ---- helpers ----

// repoRoot is the module's root (pgtest.RepoRoot: tests run in their package's directory).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := pgtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func write(t *testing.T, root, name, text string) {
	t.Helper()
	path := filepath.Join(root, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestMayCiteRule(t *testing.T) {
	is := is.New(t)
	for line, want := range map[string]bool{
		"// guards R3":                 true,
		"Rate limits, R2.":             true,
		"RR9":                          true,
		"// Retries, REPEATABLE READ":  false,
		"R":                            false,
		"no capital r at all, 3":       false,
		"ends with R then digit R0x R": true,
	} {
		is.Equal(mayCiteRule(line), want) // an R followed by a digit, and only that
	}
}
