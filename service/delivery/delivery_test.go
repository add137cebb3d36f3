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

func TestRefAndIdempotencyKey(t *testing.T) {
	is := is.New(t)
	is.Equal(Ref(42), "task-42")                      // the seed's reference
	is.Equal(IdempotencyKey(42), "ntf-task-42")       // derived from it
	is.True(IdempotencyKey(42) != IdempotencyKey(43)) // one key per task
}

func TestInputError(t *testing.T) {
	is := is.New(t)
	var err error = &InputError{Field: "channel", Reason: "unknown"}
	is.Equal(err.Error(), "invalid channel: unknown") // names the input and why
	is.True(errors.Is(err, ErrInvalidInput))          // callers test for it
	is.True(!errors.Is(err, ErrNotFound))             // and only for it
}
