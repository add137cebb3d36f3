package service_test

import (
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
)

// TestAttemptsAfterAnAccountRefusalCountOnlyTheCharged: an account refusal is refunded (docs/channels.md#account-states),
// so neither the budget nor the backoff counts it. The second attempt of a task of three whose first was
// refused is retried (budget left: 1 charged of 3) after Delay(1), the base, and not after Delay(2) or
// Delay(3) as if the refusal had been charged.
func TestAttemptsAfterAnAccountRefusalCountOnlyTheCharged(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "sms")
	id := e.create("u1", "e1", time.Hour, 2)[0].TaskID
	e.withoutStateMachine(func() { // its first attempt was refused for the account, and refunded
		_, err := e.pool.Exec(e.ctx, `UPDATE delivery_task SET attempt_count = 1, account_refusals = 1 WHERE id = $1`, id)
		is.NoErr(err)
	})
	e.sms.ScriptSend(e.ref(id), fakes.Step{Status: 503}) // certainly not accepted: retried if budget is left

	is.Equal(runOnce(t, e.dispatcher(dcfg{backoff: time.Second})).Kind, service.ResultPending) // 1 of 2 charged: budget left
	var wait float64
	is.NoErr(e.pool.QueryRow(e.ctx, `SELECT extract(epoch FROM t.next_attempt_at - a.finished_at)::float8
		FROM delivery_task t JOIN delivery_attempt a ON a.task_id = t.id AND a.attempt_no = 2 WHERE t.id = $1`, id).Scan(&wait))
	is.True(wait >= 1 && wait <= 1.25) // Delay(1) = the base, spread by up to a quarter
}
