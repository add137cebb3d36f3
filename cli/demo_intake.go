package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// demoIntake shows the intake's three moves on the same fakes, with two workers again: a send
// scheduled a few seconds ahead (waits, counted as scheduled, then sent), an event cancelled before its
// time (its tasks SUPPRESSED, never called), and a fallback chain push then sms whose push is refused
// for good (so sms is released and sent once; a push that timed out would hold the chain instead).
func demoIntake(ctx context.Context, e *env, n *service.Notifier, channels map[string]*fakes.Channel, run string, timeout time.Duration) error {
	out := e.stdout
	create := func(req service.CreateRequest) ([]service.TaskRef, error) {
		dctx, cancel := e.dbContext(ctx)
		defer cancel()
		req.TTL, req.MaxAttempts = time.Hour, 3
		_, _, tasks, err := n.Create(dctx, req)
		return tasks, err
	}
	scheduled, err := create(service.CreateRequest{UserID: "alice", EventKey: "cart-reminder-" + run,
		Body: "Your cart is waiting", Channels: []string{"push"}, Delay: 3 * time.Second})
	if err != nil {
		return err
	}
	withdrawn, err := create(service.CreateRequest{UserID: "alice", EventKey: "order-1004-shipped-" + run,
		Body: "Order 1004 has shipped", Delay: 30 * time.Minute})
	if err != nil {
		return err
	}
	chain, err := create(service.CreateRequest{UserID: "alice", EventKey: "sign-in-code-" + run,
		Body: "Your code is 204 615", Fallback: []string{"push", "sms"}})
	if err != nil {
		return err
	}
	channels["push"].ScriptSend(chain[0].Ref, fakes.Step{Status: 400}) // push refuses this one for good
	dctx, cancel := e.dbContext(ctx)
	cancelled, err := n.Cancel(dctx, "alice", "order-1004-shipped-"+run, "order 1004 was cancelled")
	if err == nil && !cancelled.Changed {
		err = errors.New("demo: the cancel changed nothing")
	}
	var st service.Status
	if err == nil {
		st, err = n.Status(dctx)
	}
	var shown service.NotificationReport
	if err == nil {
		shown, err = n.Show(dctx, service.ShowRequest{UserID: "alice", EventKey: "cart-reminder-" + run})
	}
	cancel()
	if err == nil && shown.SendAt == nil {
		err = errors.New("demo: the scheduled notification has no send time")
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== the intake: a push scheduled 3s ahead (status: %d scheduled, none overdue), an order\n"+
		"   notification cancelled before its time, and a sign-in code with the fallback chain push,sms whose\n"+
		"   push the fake refuses (400); two workers again\n", st.Scheduled)

	workers, err := startDemoWorkers(e, channels)
	if err != nil {
		return err
	}
	all := make([]demoTask, 0, 5)
	for _, group := range [][]service.TaskRef{scheduled, withdrawn, chain} {
		for _, t := range group {
			all = append(all, demoTask{TaskRef: t, user: "alice"})
		}
	}
	settled := waitSettled(ctx, e, n, all, timeout)
	stopErr := stopDemoWorkers(workers)
	rows, err := demoReport(ctx, e, n, all, channels)
	if err != nil {
		return err
	}
	labels := []string{"scheduled", "cancelled", "cancelled", "chain 1", "chain 2"}
	for i, r := range rows {
		steps := make([]string, len(r.attempts))
		for j, a := range r.attempts {
			steps[j] = string(a.Action) + ":" + string(a.Outcome)
		}
		label := "?"
		if i < len(labels) {
			label = labels[i]
		}
		fmt.Fprintf(out, "   %-9s task %d %-4s %-10s %s (messages sent: %d)\n", label, r.TaskID, r.Channel, r.task.State,
			strings.Join(steps, " -> "), r.outbound)
	}
	if err := errors.Join(settled, stopErr); err != nil {
		return err
	}
	return checkIntake(rows, len(scheduled), len(withdrawn), *shown.SendAt)
}

// checkIntake asserts what demoIntake is meant to show: rows are the scheduled task(s), sent once and
// not before sendAt (both on the database clock), then the cancelled event's, then the chain's push and sms.
func checkIntake(rows demoReportRows, scheduled, withdrawn int, sendAt time.Time) error {
	if len(rows) != scheduled+withdrawn+2 {
		return fmt.Errorf("demo: %d intake tasks, want %d", len(rows), scheduled+withdrawn+2)
	}
	for _, r := range rows[:scheduled] {
		if r.task.State != delivery.StateSent || r.outbound != 1 || r.attempts[0].StartedAt.Before(sendAt) {
			return fmt.Errorf("demo: scheduled task %d: %s, %d messages, not sent once after its time", r.TaskID, r.task.State, r.outbound)
		}
	}
	for _, r := range rows[scheduled : scheduled+withdrawn] {
		if r.task.State != delivery.StateSuppressed || r.sends != 0 || r.attempts[0].Outcome != delivery.OutcomeCancelled {
			return fmt.Errorf("demo: cancelled task %d: %s after %d calls, not SUPPRESSED by the cancel", r.TaskID, r.task.State, r.sends)
		}
	}
	push, sms := rows[len(rows)-2], rows[len(rows)-1]
	if push.task.State != delivery.StateFailed || sms.task.State != delivery.StateSent || sms.outbound != 1 {
		return fmt.Errorf("demo: fallback chain: push %s, sms %s with %d messages; want FAILED, then SENT once",
			push.task.State, sms.task.State, sms.outbound)
	}
	return nil
}
