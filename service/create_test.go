package service_test

// Input validation of Create and SetPreference, and what Create returns to a duplicate or to a user
// without any enabled channel.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

func TestCreateRejectsBadInput(t *testing.T) {
	e := newEnv(t)
	e.w.User("u1", "push", "sms") // a valid submission for u1 would write a notification and two tasks
	const day = 24 * time.Hour
	cases := []struct {
		name        string
		user, key   string
		body        string
		ttl         time.Duration
		maxAttempts int
		field       string // the field the error must name
	}{
		{"empty user", "", "k1", "b", time.Hour, 3, "user"},
		{"whitespace user", " \t\n ", "k1", "b", time.Hour, 3, "user"},
		{"201-char user", strings.Repeat("u", 201), "k1", "b", time.Hour, 3, "user"},
		{"201-rune user", strings.Repeat("ü", 201), "k1", "b", time.Hour, 3, "user"},
		{"NUL in user", "u1\x00", "k1", "b", time.Hour, 3, "user"},
		{"empty event key", "u1", "", "b", time.Hour, 3, "event key"},
		{"whitespace event key", "u1", "   ", "b", time.Hour, 3, "event key"},
		{"10,000-char event key", "u1", strings.Repeat("k", 10_000), "b", time.Hour, 3, "event key"},
		{"NUL in event key", "u1", "k\x001", "b", time.Hour, 3, "event key"},
		{"invalid UTF-8 event key", "u1", "k\xff", "b", time.Hour, 3, "event key"},
		{"empty body", "u1", "k1", "", time.Hour, 3, "body"},
		{"blank body (stdin after a failed producer)", "u1", "k1", " \r\n\t", time.Hour, 3, "body"},
		{"invalid UTF-8 body", "u1", "k1", "hello \xff\xfe world", time.Hour, 3, "body"},
		{"NUL in body", "u1", "k1", "hello\x00world", time.Hour, 3, "body"},
		{"body of 64 KiB + 1 byte", "u1", "k1", strings.Repeat("x", 64<<10+1), time.Hour, 3, "body"},
		{"body of 64 KiB + 1 byte, multi-byte", "u1", "k1", strings.Repeat("é", 32<<10) + "x", time.Hour, 3, "body"},
		{"body of 10 MB", "u1", "k1", strings.Repeat("x", 10<<20), time.Hour, 3, "body"},
		{"ttl 0", "u1", "k1", "b", 0, 3, "ttl"},
		{"ttl -5s", "u1", "k1", "b", -5 * time.Second, 3, "ttl"},
		{"ttl 1ns, expired as it is created", "u1", "k1", "b", time.Nanosecond, 3, "ttl"},
		{"ttl under 1ms", "u1", "k1", "b", 999 * time.Microsecond, 3, "ttl"},
		{"ttl over 365 days", "u1", "k1", "b", 365*day + time.Second, 3, "ttl"},
		{"max attempts 0", "u1", "k1", "b", time.Hour, 0, "max attempts"},
		{"max attempts -1", "u1", "k1", "b", time.Hour, -1, "max attempts"},
		{"max attempts 101", "u1", "k1", "b", time.Hour, 101, "max attempts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			id, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: c.user, EventKey: c.key, Body: c.body, TTL: c.ttl, MaxAttempts: c.maxAttempts})
			is.True(err != nil)                               // the input is rejected
			is.True(errors.Is(err, delivery.ErrInvalidInput)) // as invalid input, not as a database error
			is.True(strings.Contains(err.Error(), c.field))   // the message names the field
			var inputErr *delivery.InputError
			is.True(errors.As(err, &inputErr))                                 // an *InputError
			is.Equal(inputErr.Field, c.field)                                  // naming the right field
			is.True(len(err.Error()) < 300)                                    // the message does not echo a huge input
			is.Equal(id, int64(0))                                             // no id
			is.True(!created)                                                  // nothing created
			is.Equal(len(tasks), 0)                                            // no task
			is.Equal(e.scalar("SELECT count(*) FROM notification"), int64(0))  // no notification row written
			is.Equal(e.scalar("SELECT count(*) FROM delivery_task"), int64(0)) // no task row written
		})
	}

	// Positive control: the limits themselves are accepted, and the counts above would have seen rows.
	is := is.New(t)
	_, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: strings.Repeat("u", 200), EventKey: strings.Repeat("k", 200), Body: strings.Repeat("x", 64<<10), TTL: 365 * day, MaxAttempts: 100})
	is.NoErr(err)           // every value at its limit is valid
	is.True(created)        // and creates the notification
	is.Equal(len(tasks), 0) // that user has no channel
	_, created, tasks, err = e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "k1", Body: "b", TTL: time.Millisecond, MaxAttempts: 1})
	is.NoErr(err)                                                      // the smallest accepted ttl and budget are valid
	is.True(created)                                                   // a new notification
	is.Equal(len(tasks), 2)                                            // one task per enabled channel
	is.Equal(e.scalar("SELECT count(*) FROM notification"), int64(2))  // the count sees the new rows
	is.Equal(e.scalar("SELECT count(*) FROM delivery_task"), int64(2)) // and the tasks
}

func TestSetPreferenceRejectsBadInput(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name, user, channel, address string
		field                        string
	}{
		{"channel upper case", "u1", "Push", "a", "channel"},
		{"channel empty", "u1", "", "a", "channel"},
		{"channel with space", "u1", "a b", "a", "channel"},
		{"channel of 33 chars", "u1", strings.Repeat("a", 33), "a", "channel"},
		{"channel starting with digit", "u1", "9push", "a", "channel"},
		{"channel with trailing newline", "u1", "push\n", "a", "channel"},
		{"address empty", "u1", "push", "", "address"},
		{"address whitespace", "u1", "push", "  ", "address"},
		{"address of 1001 chars", "u1", "push", strings.Repeat("a", 1001), "address"},
		{"user empty", "", "push", "a", "user"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			_, err := e.n.SetPreference(e.ctx, c.user, c.channel, c.address, true)
			is.True(errors.Is(err, delivery.ErrInvalidInput))                 // rejected as invalid input
			is.True(strings.Contains(err.Error(), c.field))                   // the message names the field
			is.Equal(e.scalar("SELECT count(*) FROM channel_pref"), int64(0)) // no row written
		})
	}
}

func TestSetPreferenceIncrementsVersion(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	first, err := e.n.SetPreference(e.ctx, "u1", "push", "device-1", true)
	is.NoErr(err)                     // a first setting
	is.Equal(first.Version, int64(1)) // starts at version 1
	is.True(first.Enabled)            // enabled
	second, err := e.n.SetPreference(e.ctx, "u1", "push", "device-2", false)
	is.NoErr(err)                                      // a re-set
	is.Equal(second.Version, int64(2))                 // goes up by one
	is.Equal(second.Address, "device-2")               // replaces the address
	is.True(!second.Enabled)                           // and the switch
	is.True(!second.UpdatedAt.Before(first.UpdatedAt)) // and moves updated_at forward
	same, err := e.n.SetPreference(e.ctx, "u1", "push", "device-2", false)
	is.NoErr(err)                              // the same setting again
	is.Equal(same.Version, int64(2))           // is not a change: version stays
	is.Equal(same.UpdatedAt, second.UpdatedAt) // and so does updated_at
	other, err := e.n.SetPreference(e.ctx, "u1", "sms", "+100", true)
	is.NoErr(err)                                                                          // another channel
	is.Equal(other.Version, int64(1))                                                      // has its own version
	is.Equal(e.scalar("SELECT count(*) FROM channel_pref WHERE user_id = 'u1'"), int64(2)) // one row per channel
}

func TestCreateReturnsExistingTasksToDuplicate(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	id, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "ord-1", Body: "first body", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)           // the first submission succeeds
	is.True(created)        // and creates the notification
	is.Equal(len(tasks), 2) // with one task per enabled channel
	expiresBefore := e.scalar("SELECT (extract(epoch FROM expires_at) * 1e6)::bigint FROM notification WHERE id = $1", id)

	// Preferences change after the first submission: the duplicate still gets the original tasks only.
	e.w.User("u1", "none")
	if _, err := e.n.SetPreference(e.ctx, "u1", "push", "u1@push", false); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		id2, created2, tasks2, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "ord-1", Body: "a different body", TTL: 48 * time.Hour, MaxAttempts: 7})
		is.NoErr(err)           // a later duplicate is not an error
		is.True(!created2)      // it reports created=false
		is.Equal(id2, id)       // the same notification id
		is.Equal(tasks2, tasks) // and the same tasks
	}
	var body string
	if err := e.pool.QueryRow(e.ctx, "SELECT body FROM notification WHERE id = $1", id).Scan(&body); err != nil {
		t.Fatal(err)
	}
	is.Equal(body, "first body")                                                                                                   // the first body wins
	is.Equal(e.scalar("SELECT (extract(epoch FROM expires_at) * 1e6)::bigint FROM notification WHERE id = $1", id), expiresBefore) // the first ttl wins
	is.Equal(e.scalar("SELECT count(*) FROM notification"), int64(1))                                                              // one logical notification
	is.Equal(e.scalar("SELECT count(*) FROM delivery_task"), int64(2))                                                             // no task written by a duplicate
	is.Equal(e.scalar("SELECT count(*) FROM delivery_task WHERE max_attempts <> 3"), int64(0))                                     // the first budget wins
}

func TestCreateWithNoEnabledChannel(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u2", "push") // another user's channel must not count
	if _, err := e.n.SetPreference(e.ctx, "u1", "push", "u1@push", false); err != nil {
		t.Fatal(err)
	}
	id, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "ord-1", Body: "b", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)           // a user without an enabled channel can still be notified
	is.True(created)        // the notification is created
	is.True(id > 0)         // with an id
	is.Equal(len(tasks), 0) // and no task
	id2, created2, tasks2, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "ord-1", Body: "b", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)                                                          // a duplicate
	is.True(!created2)                                                     // is not created again
	is.Equal(id2, id)                                                      // same id
	is.Equal(len(tasks2), 0)                                               // still no task
	is.Equal(e.scalar("SELECT count(*) FROM notification"), int64(1))      // one notification
	is.Equal(e.scalar("SELECT count(*) FROM delivery_task"), int64(0))     // no task at all
	is.Equal(runOnce(t, e.dispatcher(dcfg{})).Kind, service.ResultNothing) // nothing to deliver
}
