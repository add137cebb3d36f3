package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/fakes"
)

// soakEvidence is what the soaks' invariant checker compares after a drain: the database, what the
// fake channels received and hold, and what the worker processes logged.
type soakEvidence struct {
	pool     *pgxpool.Pool
	channels map[string]*fakes.Channel // by channel name: push, sms, none
	logs     []*syncBuffer             // every worker process's stderr (JSON log lines), killed ones included
}

// soakVerdict is the checker's result: violations per invariant, and the counts the soaks print.
type soakVerdict struct {
	t          *testing.T
	pool       *pgxpool.Pool
	order      []string
	violations map[string]int

	tasks, sent, parked, failed, suppressed int
	wire, calls, equal, results             int
	outbound                                map[string]int
}

// add counts n violations of invariant name (0 makes the invariant show in the log).
func (v *soakVerdict) add(name string, n int) {
	if _, ok := v.violations[name]; !ok {
		v.order = append(v.order, name)
	}
	v.violations[name] += n
}

func (v *soakVerdict) total() int {
	n := 0
	for _, k := range v.violations {
		n += k
	}
	return n
}

// count runs a count(*) query on the soak's database.
func (v *soakVerdict) count(sql string, args ...any) int64 {
	var n int64
	if err := v.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		v.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// log prints the counts and every invariant with its violations.
func (v *soakVerdict) log(t *testing.T) {
	t.Helper()
	t.Logf("soak counts: tasks %d: SENT %d, parked %d, FAILED %d, SUPPRESSED %d; outbound push %d, sms %d, none %d; results checked against attempt rows %d",
		v.tasks, v.sent, v.parked, v.failed, v.suppressed, v.outbound["push"], v.outbound["sms"], v.outbound["none"], v.results)
	t.Logf("soak counts: requests on the wire %d, call attempts %d; tasks whose requests equal their call attempts %d of %d",
		v.wire, v.calls, v.equal, v.tasks)
	for _, name := range v.order {
		t.Logf("soak invariant %-62s violations %d", name, v.violations[name])
	}
}

// checkInvariants checks I1-I8 and I10 (docs/testing.md#soak) after the tasks drained.
func checkInvariants(t *testing.T, e soakEvidence) *soakVerdict {
	t.Helper()
	ctx := context.Background()
	v := &soakVerdict{t: t, pool: e.pool, violations: map[string]int{}, outbound: map[string]int{}}
	for _, name := range []string{
		"I1 duplicate notifications",
		"I2 written off although accepted",
		"I3 SENT without an accepted outbound",
		"I4 push sent more than once",
		"I4 sms sent more than once",
		"I5 UNKNOWN not parked after draining",
		"I5 PENDING after draining",
		"I5 SENDING after draining",
		"I5 SENDING past its lease",
		"I5 due and not claimed",
		"I6 parked without uncertain history",
		"I6 open attempt after draining",
		"I7 append-only trigger missing",
		"I7 recorded outcome differs from the observation",
		"I8 more requests on the wire than call attempts",
		"I8 fewer requests than answered attempts",
		"I8 requests for a ref no task has",
		"I10 a replay or a query found a message the task never sent",
		"I10 a message under a task's ref is another task's",
		"I11 a cancelled event called again after its cancel",
		"I12 a fallback task called while the one before was not certainly unsent",
		"I12 a fallback task called before the one before ended",
		"I12 a fallback chain sent twice",
		"I12 a fallback task unreleased behind a finished one",
	} {
		v.add(name, 0)
	}
	accepted := map[string]map[string]int{}
	requests := map[string]map[string]int{} // channel -> ref -> sends and queries the fake received
	for name, ch := range e.channels {
		snap := ch.Snapshot()
		accepted[name] = snap.Outbound
		requests[name] = snap.Sends
		for ref, n := range snap.Queries {
			requests[name][ref] += n
		}
		v.outbound[name] = ch.TotalOutbound()
	}
	type task struct {
		id                int64
		channel, ref      string
		state             string
		uncertain, parked bool
		manualSent        bool
		heldByChain       bool // unreleased behind a parked task of its fallback chain
		calls, answered   int  // attempt rows that call the channel; those of them the channel answered
		replayedOrFound   bool // an attempt read ACCEPTED_REPLAY or QUERY_FOUND: the channel said it had the message
		body, address     string
	}
	// answered: outcomes (or late outcomes of a superseded holder) that only an answer of the channel
	// produces, so the fake certainly received that attempt's request.
	rows, err := e.pool.Query(ctx, `SELECT t.id, t.channel, t.ref, t.state, t.outcome_uncertain, t.needs_review,
		EXISTS (SELECT FROM delivery_attempt a WHERE a.task_id = t.id AND a.outcome = 'MANUAL_SENT'),
		(SELECT count(*) FROM delivery_attempt a WHERE a.task_id = t.id AND a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND')),
		(SELECT count(*) FROM delivery_attempt a WHERE a.task_id = t.id AND a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND')
			AND coalesce(nullif(a.outcome, 'LEASE_EXPIRED'), a.late_outcome) IN ('ACCEPTED', 'ACCEPTED_REPLAY',
			'QUERY_FOUND', 'QUERY_NOT_FOUND', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'REJECTED', 'GATEWAY_ERROR')),
		EXISTS (SELECT FROM delivery_attempt a WHERE a.task_id = t.id
			AND coalesce(nullif(a.outcome, 'LEASE_EXPIRED'), a.late_outcome) IN ('ACCEPTED_REPLAY', 'QUERY_FOUND')),
		n.body, coalesce(p.address, ''),
		t.state = 'PENDING' AND t.next_attempt_at IS NULL AND EXISTS (SELECT FROM delivery_task e
			WHERE e.notification_id = t.notification_id AND e.fallback_position < t.fallback_position AND e.needs_review)
		FROM delivery_task t
		JOIN notification n ON n.id = t.notification_id
		LEFT JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = t.channel`)
	if err != nil {
		t.Fatalf("read tasks: %v", err)
	}
	var tasks []task
	for rows.Next() {
		var tk task
		if err := rows.Scan(&tk.id, &tk.channel, &tk.ref, &tk.state, &tk.uncertain, &tk.parked, &tk.manualSent,
			&tk.calls, &tk.answered, &tk.replayedOrFound, &tk.body, &tk.address, &tk.heldByChain); err != nil {
			t.Fatalf("read tasks: %v", err)
		}
		tasks = append(tasks, tk)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read tasks: %v", err)
	}
	v.tasks = len(tasks)

	// A few examples per invariant: a negative control breaks hundreds of tasks the same way.
	examples := map[string]int{}
	example := func(name, format string, args ...any) {
		if examples[name]++; examples[name] <= 5 {
			t.Logf(format, args...)
		}
	}
	refs := map[string]map[string]bool{} // channel -> refs of its tasks
	for _, tk := range tasks {
		if refs[tk.channel] == nil {
			refs[tk.channel] = map[string]bool{}
		}
		refs[tk.channel][tk.ref] = true
		out := accepted[tk.channel][tk.ref]
		// I8 (R3): every request on the wire has its attempt row. A request is never sent twice for
		// one row (a transport's resend would be), so the fake's count for a task is at most its call
		// attempts, and at least the attempts it answered. It may be less than the rows: a worker
		// killed, or frozen past its timeout, between the claim's commit and writing the request
		// leaves a row without a request.
		got := requests[tk.channel][tk.ref]
		v.wire, v.calls = v.wire+got, v.calls+tk.calls
		if got == tk.calls {
			v.equal++
		}
		if got > tk.calls {
			v.add("I8 more requests on the wire than call attempts", 1)
			example("I8 more", "I8: task %d (%s): %d requests, %d call attempts", tk.id, tk.channel, got, tk.calls)
		}
		if got < tk.answered {
			v.add("I8 fewer requests than answered attempts", 1)
			example("I8 fewer", "I8: task %d (%s): %d requests, %d answered attempts", tk.id, tk.channel, got, tk.answered)
		}
		// I10: what a channel holds under a task's ref is that task's message (its body, to its
		// address), and a replay or a query that said "I have it" spoke of that message. A ref that
		// named another task before (ids handed out again after a restore, or a failover that lost
		// WAL) fails both: the channel answers for a message this task never sent.
		if ch := e.channels[tk.channel]; ch != nil {
			own := false
			for _, m := range ch.Messages(tk.ref) {
				if m.Body == tk.body && m.To == tk.address {
					own = true
				} else {
					v.add("I10 a message under a task's ref is another task's", 1)
				}
			}
			if tk.replayedOrFound && !own {
				v.add("I10 a replay or a query found a message the task never sent", 1)
				example("I10", "I10: task %d (%s, ref %s) was told its message exists, and the channel holds none of its own", tk.id, tk.channel, tk.ref)
			}
		}
		switch tk.state {
		case "SENT":
			v.sent++
			if out == 0 && !tk.manualSent {
				v.add("I3 SENT without an accepted outbound", 1)
			}
		case "FAILED", "SUPPRESSED":
			if tk.state == "FAILED" {
				v.failed++
			} else {
				v.suppressed++
			}
			if out > 0 {
				v.add("I2 written off although accepted", 1)
			}
		case "UNKNOWN":
			if !tk.parked {
				v.add("I5 UNKNOWN not parked after draining", 1)
			}
			v.parked++
			if !tk.uncertain {
				v.add("I6 parked without uncertain history", 1)
			}
		case "PENDING":
			if !tk.heldByChain { // a fallback task waits, unreleased, while an earlier one is parked
				v.add("I5 PENDING after draining", 1)
			}
		default:
			v.add("I5 "+tk.state+" after draining", 1)
		}
		if (tk.channel == "push" || tk.channel == "sms") && out > 1 {
			v.add("I4 "+tk.channel+" sent more than once", 1)
		}
	}
	// I8: a request under a ref that no task has was made for an attempt row that does not exist
	// (lost with its task in a failover that lost WAL).
	for name, byRef := range requests {
		for ref, n := range byRef {
			if !refs[name][ref] {
				v.add("I8 requests for a ref no task has", n)
			}
		}
	}
	v.add("I1 duplicate notifications", int(v.count(`SELECT count(*) FROM (SELECT FROM notification
		GROUP BY user_id, event_key HAVING count(*) > 1) d`)))
	// I5: nothing is stuck beyond its lease: no task still held after its lease ran out, no task
	// waiting that is due and nobody took.
	v.add("I5 SENDING past its lease", int(v.count(`SELECT count(*) FROM delivery_task
		WHERE state = 'SENDING' AND lease_until < now()`)))
	v.add("I5 due and not claimed", int(v.count(`SELECT count(*) FROM delivery_task
		WHERE (state = 'PENDING' OR (state = 'UNKNOWN' AND NOT needs_review)) AND next_attempt_at <= now()`)))
	v.add("I6 open attempt after draining", int(v.count(`SELECT count(*) FROM delivery_attempt WHERE outcome IS NULL`)))
	// I11: a cancelled event is never called again: at most one call per task starts after the cancel,
	// the one a claim already had on its way (a claim's transaction may start before the cancel commits).
	v.add("I11 a cancelled event called again after its cancel", int(v.count(`SELECT count(*) FROM (
		SELECT FROM delivery_attempt a JOIN delivery_task t ON t.id = a.task_id JOIN notification n ON n.id = t.notification_id
		WHERE n.cancelled_at IS NOT NULL AND a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.started_at > n.cancelled_at
		GROUP BY a.task_id HAVING count(*) > 1) d`)))
	// I12: a fallback chain calls a channel only after the one before ended certainly not sent (FAILED or
	// SUPPRESSED, its last attempt finished before the call started), never after one was SENT, and
	// leaves no task unreleased behind a finished one.
	v.add("I12 a fallback task called while the one before was not certainly unsent", int(v.count(`SELECT count(*)
		FROM delivery_task t JOIN delivery_task b ON b.notification_id = t.notification_id AND b.fallback_position = t.fallback_position - 1
		WHERE b.state NOT IN ('FAILED', 'SUPPRESSED')
		  AND EXISTS (SELECT FROM delivery_attempt a WHERE a.task_id = t.id AND a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND'))`)))
	v.add("I12 a fallback task called before the one before ended", int(v.count(`SELECT count(*)
		FROM delivery_task t JOIN delivery_task b ON b.notification_id = t.notification_id AND b.fallback_position = t.fallback_position - 1
		WHERE (SELECT min(a.started_at) FROM delivery_attempt a WHERE a.task_id = t.id AND a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND'))
		    < (SELECT max(coalesce(a.finished_at, a.started_at)) FROM delivery_attempt a WHERE a.task_id = b.id)`)))
	v.add("I12 a fallback chain sent twice", int(v.count(`SELECT count(*) FROM (SELECT FROM delivery_task
		WHERE fallback_position IS NOT NULL AND state = 'SENT' GROUP BY notification_id HAVING count(*) > 1) d`)))
	v.add("I12 a fallback task unreleased behind a finished one", int(v.count(`SELECT count(*)
		FROM delivery_task t JOIN delivery_task b ON b.notification_id = t.notification_id AND b.fallback_position = t.fallback_position - 1
		WHERE t.state = 'PENDING' AND t.next_attempt_at IS NULL AND b.state IN ('SENT', 'FAILED', 'SUPPRESSED')`)))
	v.add("I7 append-only trigger missing", int(1-v.count(`SELECT count(*) FROM pg_trigger
		WHERE tgname = 'delivery_attempt_append_only' AND tgenabled <> 'D'`)))

	// I7: what each worker observed (its RESULT log line) is in the attempt row, as outcome or, when the
	// attempt was superseded, as late_outcome; never overwritten by anything else.
	mismatched := 0
	for _, log := range e.logs {
		sc := bufio.NewScanner(strings.NewReader(log.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var ev struct {
				Msg     string `json:"msg"`
				Task    int64  `json:"task"`
				Attempt int    `json:"attempt"`
				Outcome string `json:"outcome"`
				Result  string `json:"result"`
			}
			if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Msg != "RESULT" || ev.Attempt == 0 || ev.Outcome == "" {
				continue
			}
			v.results++
			var outcome, late *string
			err := e.pool.QueryRow(ctx, `SELECT outcome, late_outcome FROM delivery_attempt WHERE task_id = $1 AND attempt_no = $2`,
				ev.Task, ev.Attempt).Scan(&outcome, &late)
			switch {
			case err != nil:
				mismatched++
			case ev.Result == "STALE":
				if late == nil || *late != ev.Outcome {
					mismatched++
				}
			case outcome == nil || *outcome != ev.Outcome:
				mismatched++
			}
		}
	}
	v.add("I7 recorded outcome differs from the observation", mismatched)
	return v
}
