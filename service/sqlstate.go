package service

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// How the protocol reads the server's errors, by SQLSTATE class (the first two characters).

// sqlState is the SQLSTATE of the server's error in err's chain, "" when it holds none (the server
// never answered: a broken connection, a timeout).
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func sqlClass(err error) string {
	if s := sqlState(err); len(s) >= 2 {
		return s[:2]
	}
	return ""
}

// pgMessage is the server's message in err's chain, or err's text.
func pgMessage(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	return err.Error()
}

// refusedForRow reports whether the server refused a statement for what one of the rows it touched
// holds: a data exception (22), a constraint (23) or a PL/pgSQL exception (P0, the state machine's and
// the attempt rules' triggers). Nothing of the statement was written. A claim then claims its tasks one
// at a time, setting the one at fault aside (claimEach); a deadlock or serialization failure says
// nothing about a row there: the claim is simply tried again later.
func refusedForRow(err error) bool {
	switch sqlClass(err) {
	case "22", "23", "P0":
		return true
	}
	return false
}

// rowFault reports whether the server refused a finish for what one of its rows holds (refusedForRow),
// or rolled it back to break a deadlock (40): the statement is certainly not written, and finishing each
// row alone saves the rows that are not at fault (finishEach). Anything else fails the whole finish; a
// transient failure is sent again (Dispatcher.finish).
func rowFault(err error) bool {
	return refusedForRow(err) || sqlClass(err) == "40"
}

// transient reports whether a statement that failed may succeed when sent again once the database is
// back or has failed over: the server never answered (a broken connection, a timeout: err holds no
// SQLSTATE), or turned the statement away for its own state: a connection exception (08), an operator
// intervention (57: the administrator terminated the session, the server is shutting down or starting
// up), insufficient resources (53), a system error (58), or read-only (25006: the server is a standby
// now). A refusal for the statement itself (a row, a privilege, a missing column) is not transient.
// A cancellation of the caller's own context is not either: the caller gave up.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	switch sqlClass(err) {
	case "":
		return true
	case "08", "53", "57", "58":
		return true
	}
	return sqlState(err) == sqlStateReadOnly
}
