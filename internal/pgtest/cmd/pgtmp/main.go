// Command pgtmp starts a throwaway PostgreSQL cluster (as the tests do, see
// internal/pgtest, but on disk in os.TempDir(), where a benchmark's database
// meets the costs production's does), prints its URL, and removes it when done.
//
//	pgtmp [-migrate] [-tmpfs] [-db NAME] [-url-file FILE]              # until SIGINT/SIGTERM
//	pgtmp [-migrate] [-tmpfs] [-db NAME] [-url-file FILE] -- CMD ARGS  # while CMD runs
//
// Without a command it prints DATABASE_URL=<url> on stdout, then waits for
// SIGINT/SIGTERM/SIGHUP. With a command it prints that line on stderr, runs
// the command with DATABASE_URL and PG_BIN (the server's binary directory) in
// its environment, forwards signals to it, and exits with its exit code.
// Either way the cluster is stopped and its directory removed at the end.
//
// -tmpfs puts the cluster on /dev/shm when it is a tmpfs with room, as the
// tests' own (`just mutants-service`: every mutant's tests create and drop
// databases); -db NAME creates database NAME and points the URL at it (default: the
// "postgres" database); -migrate applies <repo>/schema with dbmate to it;
// -url-file writes the bare URL (one line) to FILE, after the cluster is
// ready and migrated, so that a script can wait for the file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/notifierhq/notifier/internal/pgtest"
)

func main() {
	os.Exit(run())
}

func run() int {
	migrate := flag.Bool("migrate", false, "apply the dbmate migrations of <repo>/schema")
	dbName := flag.String("db", "", "create this database and point the URL at it")
	urlFile := flag.String("url-file", "", "also write the URL to this file")
	tmpfs := flag.Bool("tmpfs", false, "for tests: put the cluster on /dev/shm when it is a tmpfs with 2 GiB free, as the tests' own (a benchmark's stays on disk)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: pgtmp [-migrate] [-tmpfs] [-db NAME] [-url-file FILE] [-- command args...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	command := flag.Args()

	// Catch signals from the start so that the cluster is always removed.
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)

	// Any signal cancels ctx (aborting a startup in progress) and is relayed
	// to the command, if any.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	relay := make(chan os.Signal, 4)
	go func() {
		for sig := range sigc {
			cancel()
			select {
			case relay <- sig:
			default:
			}
		}
	}()

	start := pgtest.StartServer
	if *tmpfs {
		start = pgtest.StartTestServer
	}
	srv, err := start(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtmp:", err)
		return 1
	}
	code := serve(ctx, srv, *migrate, *dbName, *urlFile, command, relay)
	if err := srv.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtmp: stop cluster:", err)
		if code == 0 {
			code = 1
		}
	}
	if *urlFile != "" {
		_ = os.Remove(*urlFile)
	}
	return code
}

func serve(ctx context.Context, srv *pgtest.Server, migrate bool, dbName, urlFile string, command []string, relay <-chan os.Signal) int {
	dbURL := srv.URL()
	if dbName != "" {
		if err := createDB(ctx, dbURL, dbName); err != nil {
			fmt.Fprintln(os.Stderr, "pgtmp:", err)
			return 1
		}
		u, _ := url.Parse(dbURL)
		u.Path = "/" + dbName
		dbURL = u.String()
	}
	if migrate {
		if err := pgtest.Migrate(ctx, dbURL); err != nil {
			fmt.Fprintln(os.Stderr, "pgtmp:", err)
			return 1
		}
	}
	if ctx.Err() != nil { // interrupted while starting
		return 130
	}
	if urlFile != "" {
		tmp := urlFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(dbURL+"\n"), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "pgtmp:", err)
			return 1
		}
		if err := os.Rename(tmp, urlFile); err != nil {
			fmt.Fprintln(os.Stderr, "pgtmp:", err)
			return 1
		}
	}

	line := "DATABASE_URL=" + dbURL + "\n"
	info := fmt.Sprintf("pgtmp: %s on 127.0.0.1:%d, data in %s (removed at exit)\n", srv.Version(), srv.Port(), filepath.Dir(srv.DataDir()))
	if len(command) == 0 {
		fmt.Fprint(os.Stderr, info)
		os.Stdout.WriteString(line)
		_ = os.Stdout.Sync()
		fmt.Fprintln(os.Stderr, "pgtmp: press Ctrl-C to stop the cluster and delete its data")
		<-ctx.Done()
		fmt.Fprintln(os.Stderr, "pgtmp: stopping the cluster")
		return 0
	}

	fmt.Fprint(os.Stderr, info+line)
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "PG_BIN="+srv.BinDir())
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtmp:", err)
		return 127
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-relay:
			_ = cmd.Process.Signal(sig)
		case err := <-done:
			var exit *exec.ExitError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &exit):
				if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return exit.ExitCode()
			default:
				fmt.Fprintln(os.Stderr, "pgtmp:", err)
				return 1
			}
		}
	}
}

func createDB(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}
