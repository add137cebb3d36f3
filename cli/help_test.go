package cli

import (
	"io/fs"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/matryer/is"
	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
)

// maxHelpLinesInCode is the longest description a command keeps in its Go file; a longer one lives in
// help/<command>.txt.
const maxHelpLinesInCode = 15

// placeholder is how a help file marks a value its command fills in from code ({{min_retention}}).
var placeholder = regexp.MustCompile(`\\\{\\\{[a-z_]+\\\}\\\}`)

// describes says whether desc is the help file text with its placeholders filled in and the shared exit
// codes after it, as helpText and its command make it.
func describes(text, desc string) bool {
	pattern := placeholder.ReplaceAllString(regexp.QuoteMeta(text+"\n"+exitCodesHelp), `.+?`)
	return regexp.MustCompile(`(?s)\A` + pattern + `\z`).MatchString(desc)
}

// TestHelpFiles: every file in help/ is the description of the command it is named after (no orphan,
// none left unused), and every command whose description runs past maxHelpLinesInCode lines takes
// it from its file.
func TestHelpFiles(t *testing.T) {
	is := is.New(t)
	commands := map[string]*cli.Command{}
	for _, c := range newApp(&env{}).Commands {
		commands[c.Name] = c
	}
	files, err := fs.Glob(helpFiles, "help/*.txt")
	is.NoErr(err)
	is.True(len(files) > 0) // the files are embedded
	fromFile := map[string]bool{}
	for _, f := range files {
		name := strings.TrimSuffix(path.Base(f), ".txt")
		c, ok := commands[name]
		if !ok {
			t.Errorf("%s: no command %q: an orphan help file", f, name)
			continue
		}
		b, err := helpFiles.ReadFile(f)
		is.NoErr(err)
		if !describes(string(b), c.Description) {
			t.Errorf("%s is not %s's description", f, name)
		}
		fromFile[name] = true
	}
	for name, c := range commands {
		body := strings.TrimSuffix(c.Description, exitCodesHelp)
		if lines := strings.Count(strings.TrimRight(body, "\n"), "\n") + 1; lines > maxHelpLinesInCode && !fromFile[name] {
			t.Errorf("%s: a description of %d lines in code: move it to help/%s.txt", name, lines, name)
		}
	}
	is.True(strings.Contains(commands["prune"].Description, "at least "+service.MinRetention.String()+".")) // prune fills in its placeholder
}

// TestHelpFilesCanFail is the negative control of describes: a changed word and a missing exit-code
// paragraph are told apart, and braces in prose are matched as they are.
func TestHelpFilesCanFail(t *testing.T) {
	is := is.New(t)
	text := "Deletes what is older than {{min_retention}}.\n"
	is.True(describes(text, "Deletes what is older than 1h0m0s.\n\n"+exitCodesHelp))  // filled in
	is.True(!describes(text, "Deletes what is newer than 1h0m0s.\n\n"+exitCodesHelp)) // another text
	is.True(!describes(text, "Deletes what is older than 1h0m0s.\n"))                 // without the exit codes
	is.True(!describes("Lists {state,result}.\n", "Lists x.\n\n"+exitCodesHelp))      // braces in prose are no placeholder
}
