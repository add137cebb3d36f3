package service_test

import (
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/dbgen"
)

// TestArrayParamsEncodeFirstTime checks that every parameter of the statements that take arrays (the
// claim, start and finish of every delivery, review's histories) encodes in the format pgx tries first. When it does not,
// pgx still succeeds by retrying in the other format, so nothing fails: it only searches for a plan,
// formats an error and encodes twice on every call (as a []string for a uuid[] parameter did).
func TestArrayParamsEncodeFirstTime(t *testing.T) {
	e := newEnv(t)
	statements := []struct {
		name   string
		sql    string
		params any // the Go types the generated method passes, in parameter order
	}{
		{"TaskClaim", dbgen.TaskClaim, dbgen.TaskClaimParams{}},
		{"TaskStartAttempts", dbgen.TaskStartAttempts, dbgen.TaskStartAttemptsParams{}},
		{"TaskFinish", dbgen.TaskFinish, dbgen.TaskFinishParams{}},
		{"AttemptMarkLeaseExpired", dbgen.AttemptMarkLeaseExpired, struct{ AttemptTokens []string }{}},
		{"AttemptListByTasks", dbgen.AttemptListByTasks, struct{ TaskIDs []int64 }{}},
	}
	conn, err := e.pool.Acquire(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	types := conn.Conn().TypeMap()
	for _, st := range statements {
		t.Run(st.name, func(t *testing.T) {
			is := is.New(t)
			sd, err := conn.Conn().Prepare(e.ctx, "", st.sql)
			is.NoErr(err) // prepare
			args := sampleArgs(st.params)
			is.Equal(len(args), len(sd.ParamOIDs)) // one Go value per parameter
			for i, arg := range args {
				format := types.FormatCodeForOID(sd.ParamOIDs[i])
				if _, ok := arg.(string); ok {
					format = pgtype.TextFormatCode // what pgx chooses for a string
				}
				_, err := types.Encode(sd.ParamOIDs[i], format, arg, nil)
				if err != nil {
					t.Errorf("parameter $%d (%T) needs pgx's fallback: %v", i+1, arg, err)
				}
			}
		})
	}
}

// sampleArgs gives one value per field of a params struct; slices get one element, strings the shape of
// an attempt token (also valid text).
func sampleArgs(params any) []any {
	v := reflect.ValueOf(params)
	args := make([]any, v.NumField())
	for i := range v.NumField() {
		f := reflect.New(v.Field(i).Type()).Elem()
		if f.Kind() == reflect.Slice {
			elem := reflect.New(f.Type().Elem()).Elem()
			if elem.Kind() == reflect.String {
				elem.SetString("0b0e5c2a-5d43-4c1e-9a3f-1f6a2b7c8d90")
			}
			f = reflect.Append(f, elem)
		}
		args[i] = f.Interface()
	}
	return args
}
