package cli

import (
	"embed"
	"fmt"
)

// helpFiles holds the descriptions too long to read well in code: help/<command>.txt, prose edited as
// prose, apart from the flags. A file may hold a {{placeholder}} that its command fills in from code.
//
//go:embed help/*.txt
var helpFiles embed.FS

// helpText is a command's description: its file in help/, then the exit codes every command shares.
// The files are compiled in, so a missing one is a programming error (TestHelpFiles finds it) and
// panics when the commands are built.
func helpText(command string) string {
	b, err := helpFiles.ReadFile("help/" + command + ".txt")
	if err != nil {
		panic(fmt.Sprintf("cli: no help text for %s: %v", command, err))
	}
	return string(b) + "\n" + exitCodesHelp
}
