package delivery

import (
	"errors"
	"testing"

	"github.com/matryer/is"
)

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{
		"idempotent": ModeIdempotent, "IDEMPOTENT": ModeIdempotent, "Idempotent": ModeIdempotent,
		"queryable": ModeQueryable, "QueryAble": ModeQueryable,
		"none": ModeNone, "NONE": ModeNone, "nOnE": ModeNone,
	} {
		is := is.New(t)
		got, err := ParseMode(in)
		is.NoErr(err)       // a mode in any case
		is.Equal(got, want) // the mode it names
	}
	for _, in := range []string{"", "sometimes", "idempotent ", "ïdempotent", "none,queryable"} {
		is := is.New(t)
		_, err := ParseMode(in)
		is.True(errors.Is(err, ErrInvalidInput)) // not a mode
	}
}

// TestUpper: only ASCII a-z change, each to its capital; the bytes next to the range stay.
func TestUpper(t *testing.T) {
	is := is.New(t)
	is.Equal(upper("azAZ`{@[09_-é"), "AZAZ`{@[09_-é") // ` is 'a'-1 and { is 'z'+1
	is.Equal(upper("queryable"), "QUERYABLE")
	is.Equal(upper(""), "")
}

func TestModeRecoverable(t *testing.T) {
	is := is.New(t)
	is.True(ModeIdempotent.Recoverable()) // resend with the same key
	is.True(ModeQueryable.Recoverable())  // query first
	is.True(!ModeNone.Recoverable())      // parked for a human
	is.True(!Mode("OTHER").Recoverable()) // an unknown mode is not trusted
}

func TestIdempotencyKey(t *testing.T) {
	is := is.New(t)
	ref := "0b5e7c1a-9f2d-4e3b-8a6c-1d2e3f4a5b6c"
	is.Equal(IdempotencyKey(ref), "ntf-"+ref)                 // derived from the task's reference
	is.Equal(IdempotencyKey("task-42"), "ntf-task-42")        // a reference from before refs were random
	is.True(IdempotencyKey(ref) != IdempotencyKey("task-42")) // one key per task
}

// TestParseRef holds ParseRef to the schema's delivery_task_ref_check at each of its edges: what a
// provider hands back is only taken for one of our tasks if the database could hold it as a ref.
func TestParseRef(t *testing.T) {
	uuid := "0b5e7c1a-9f2d-4e3b-8a6c-1d2e3f4a5b6c"
	for _, tc := range []struct {
		in, ref string
		ok      bool
	}{
		{uuid, uuid, true},
		{"ntf-" + uuid, uuid, true},                                    // the idempotency key
		{"  " + uuid + "\n", uuid, true},                               // surrounding space is not part of it
		{"task-1", "task-1", true},                                     // the smallest id
		{"ntf-task-42", "task-42", true},                               // a key from before refs were random
		{"task-9223372036854775807", "task-9223372036854775807", true}, // 19 digits: bigint's largest
		{"task-12345678901234567890", "", false},                       // 20 digits: no bigint
		{"task-", "", false},                                           // no id
		{"task-0", "", false},                                          // ids start at 1, never with 0
		{"task-01", "", false},                                         // nor a leading zero
		{"task-1a", "", false},                                         // digits only
		{"task--1", "", false},                                         // no sign
		{"", "", false},
		{"ntf-", "", false},
		{"0B5E7C1A-9F2D-4E3B-8A6C-1D2E3F4A5B6C", "", false}, // gen_random_uuid's text is lowercase
		{uuid[:35], "", false},                              // one short
		{uuid + "0", "", false},                             // one long
		{"0b5e7c1a09f2d-4e3b-8a6c-1d2e3f4a5b6c", "", false}, // a digit where the first dash goes
		{"0b5e7c1a-9f2d04e3b-8a6c-1d2e3f4a5b6c", "", false}, // the second
		{"0b5e7c1a-9f2d-4e3b08a6c-1d2e3f4a5b6c", "", false}, // the third
		{"0b5e7c1a-9f2d-4e3b-8a6c01d2e3f4a5b6c", "", false}, // the fourth
		{"-b5e7c1a-9f2d-4e3b-8a6c-1d2e3f4a5b6c", "", false}, // a dash where a digit goes
		{"gb5e7c1a-9f2d-4e3b-8a6c-1d2e3f4a5b6c", "", false}, // g is past f
		{"0b5e7c1a-9f2d-4e3b-8a6c-1d2e3f4a5b6`", "", false}, // ` is just before a
		{"0b5e7c1a-9f2d-4e3b-8a6c-1d2e3f4a5b6/", "", false}, // / is just before 0
		{"0b5e7c1a-9f2d-4e3b-8a6c-1d2e3f4a5b6:", "", false}, // : is just after 9
		{"0123456789-abcdef", "", false},
		{"00000000-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000000", true},
		{"99999999-9999-9999-9999-ffffffffffff", "99999999-9999-9999-9999-ffffffffffff", true},
		{"aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa", "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa", true},
	} {
		ref, ok := ParseRef(tc.in)
		if ref != tc.ref || ok != tc.ok {
			t.Errorf("ParseRef(%q) = %q, %v; want %q, %v", tc.in, ref, ok, tc.ref, tc.ok)
		}
	}
}

func TestInputError(t *testing.T) {
	is := is.New(t)
	var err error = &InputError{Field: "channel", Reason: "unknown"}
	is.Equal(err.Error(), "invalid channel: unknown") // names the input and why
	is.True(errors.Is(err, ErrInvalidInput))          // callers test for it
	is.True(!errors.Is(err, ErrNotFound))             // and only for it
}
