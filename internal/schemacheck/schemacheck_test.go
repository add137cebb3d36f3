package schemacheck

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// renamedFiles are the only edits allowed in the text of a definition (a function's body, a comment):
// the old migrations' file names, which hints and comments cite, and their v1 homes. Applied to the
// v0 side before comparing, so any other change of text still shows.
var renamedFiles = []struct{ old, new string }{
	// The moves, their hint and the outcomes by action now head 003 (010's table of moves and its rules).
	{"schema/010_state_machine.sql", "schema/003_state_machine.sql"},
	// The claim's statement-level evidence check lives beside the rest of the state machine.
	{"schema/021_hot_path_checks.sql", "schema/003_state_machine.sql"},
	// The refund of an account refusal is a rule of the state machine's.
	{"schema/025_account_pause.sql", "schema/003_state_machine.sql"},
	// The ref's rule is with the task's table.
	{"schema/016_task_ref.sql", "schema/001_tables.sql"},
	// Short citations "schema/NNN" of the same files.
	{"(schema/010)", "(schema/003)"},
	{"(schema/021)", "(schema/003)"},
	{"(schema/022, in place of delivery_attempt_task_id_fkey)", "(schema/003, in place of a foreign key)"},
	{"(schema/025)", "(schema/003)"},
	{"(schema/027)", "(schema/005)"},
	{"(schema/029)", "(schema/005)"},
	{"schema/027)", "schema/005)"},
	{"schema/028), the others wait unreleased", "schema/005), the others wait unreleased"},
	{"(schema/020)", "(schema/001)"},
	{"schema/026, 028, 029, docs/protocol.md#create", "schema/005, docs/protocol.md#create"},
	{"for tasks older than schema/016", "for tasks created before refs were random"},
}

// Why each allowed difference exists; docs/protocol.md#schema-v1 explains each. All of them move what
// the claim and the finish need not index off the rows they update (issue 41, item 2): the task's
// unique keys to delivery_task_key, the attempts' provider ids to delivery_task_provider_msg.
const (
	keysMovedOff             = "the task's unique keys, (notification_id, channel) and ref, moved to delivery_task_key"
	keyTable                 = "delivery_task_key: a task's unique keys on a row that is never updated"
	keyTriggers              = "delivery_task_key_insert writes a task's keys with it; delivery_task_key_fixed keeps them while it exists"
	keysReadByEveryRole      = "every role reads delivery_task_key as it reads delivery_task; no role writes it"
	keyTriggerFunctionPublic = "EXECUTE for PUBLIC, PostgreSQL's default, as on every trigger function of v0"
	cancelThroughKeys        = "notifier_cancel finds the notification's tasks through delivery_task_key"

	attemptFinishHOT          = "delivery_attempt loses its provider-id index and gets fillfactor 50: its finish is a HOT update"
	providerMsgTable          = "delivery_task_provider_msg: a task's provider message ids that its row does not carry"
	providerMsgTriggers       = "the triggers that record an attempt's id its task does not carry, a task's replaced id, and keep them"
	providerMsgReadAsAttempts = "delivery_task_provider_msg is read by the roles that read delivery_attempt; no role writes it"
	providerMsgFunctionPublic = "EXECUTE for PUBLIC, PostgreSQL's default, as on every trigger function of v0"

	fallbackFixedOnFastPath = "the state machine's fast path, the function's first test and its trigger's WHEN, holds fallback_position fixed: v0's let a claim or a finish that also moved a task in its chain pass unchecked"
)

// allowedDifferences lists, by object, the differences v1 may have from v0, each with its reason
// (docs/protocol.md#schema-v1). Exact keys only: a difference in any other object, or of another kind
// in one of these (a grant on a column that is not listed), fails the test.
var allowedDifferences = map[string]string{
	// The task's two unique keys are no longer on delivery_task: same names, on delivery_task_key.
	"constraint delivery_task.delivery_task_notification_channel_key": keysMovedOff,
	"constraint delivery_task.delivery_task_ref_key":                  keysMovedOff,
	"index delivery_task_notification_channel_key":                    keysMovedOff,
	"index delivery_task_ref_key":                                     keysMovedOff,
	// delivery_task_key, its columns and its keys: one row per task, never updated (schema/001).
	"column delivery_task_key.channel":                                    keyTable,
	"column delivery_task_key.notification_id":                            keyTable,
	"column delivery_task_key.ref":                                        keyTable,
	"column delivery_task_key.task_id":                                    keyTable,
	"constraint delivery_task_key.delivery_task_key_pkey":                 keyTable,
	"constraint delivery_task_key.delivery_task_key_task_id_fkey":         keyTable,
	"constraint delivery_task_key.delivery_task_notification_channel_key": keyTable,
	"constraint delivery_task_key.delivery_task_ref_key":                  keyTable,
	"index delivery_task_key_pkey":                                        keyTable,
	"table delivery_task_key":                                             keyTable,
	"table delivery_task_key_pkey":                                        keyTable,
	// The key rows' writer (the statement-level insert trigger) and their guard (schema/003).
	"function delivery_task_key_fixed()":                      keyTriggers,
	"function delivery_task_key_insert()":                     keyTriggers,
	"trigger delivery_task.delivery_task_key_insert":          keyTriggers,
	"trigger delivery_task_key.delivery_task_key_fixed":       keyTriggers,
	"trigger delivery_task_key.delivery_task_key_no_truncate": keyTriggers,
	// Every role reads the keys as it reads delivery_task, none writes them (schema/002).
	"grant SELECT on table delivery_task_key to notifier_creator":                keysReadByEveryRole,
	"grant SELECT on table delivery_task_key to notifier_operator":               keysReadByEveryRole,
	"grant SELECT on table delivery_task_key to notifier_receiver":               keysReadByEveryRole,
	"grant SELECT on table delivery_task_key to notifier_worker":                 keysReadByEveryRole,
	"policy delivery_task_key.delivery_task_key_creator_select":                  keysReadByEveryRole,
	"policy delivery_task_key.delivery_task_key_operator_select":                 keysReadByEveryRole,
	"policy delivery_task_key.delivery_task_key_receiver_select":                 keysReadByEveryRole,
	"policy delivery_task_key.delivery_task_key_worker_select":                   keysReadByEveryRole,
	"privilege of notifier_creator on column delivery_task_key.channel":          keysReadByEveryRole,
	"privilege of notifier_creator on column delivery_task_key.notification_id":  keysReadByEveryRole,
	"privilege of notifier_creator on column delivery_task_key.ref":              keysReadByEveryRole,
	"privilege of notifier_creator on column delivery_task_key.task_id":          keysReadByEveryRole,
	"privilege of notifier_creator on table delivery_task_key":                   keysReadByEveryRole,
	"privilege of notifier_operator on column delivery_task_key.channel":         keysReadByEveryRole,
	"privilege of notifier_operator on column delivery_task_key.notification_id": keysReadByEveryRole,
	"privilege of notifier_operator on column delivery_task_key.ref":             keysReadByEveryRole,
	"privilege of notifier_operator on column delivery_task_key.task_id":         keysReadByEveryRole,
	"privilege of notifier_operator on table delivery_task_key":                  keysReadByEveryRole,
	"privilege of notifier_receiver on column delivery_task_key.channel":         keysReadByEveryRole,
	"privilege of notifier_receiver on column delivery_task_key.notification_id": keysReadByEveryRole,
	"privilege of notifier_receiver on column delivery_task_key.ref":             keysReadByEveryRole,
	"privilege of notifier_receiver on column delivery_task_key.task_id":         keysReadByEveryRole,
	"privilege of notifier_receiver on table delivery_task_key":                  keysReadByEveryRole,
	"privilege of notifier_worker on column delivery_task_key.channel":           keysReadByEveryRole,
	"privilege of notifier_worker on column delivery_task_key.notification_id":   keysReadByEveryRole,
	"privilege of notifier_worker on column delivery_task_key.ref":               keysReadByEveryRole,
	"privilege of notifier_worker on column delivery_task_key.task_id":           keysReadByEveryRole,
	"privilege of notifier_worker on table delivery_task_key":                    keysReadByEveryRole,
	"role_table_grant SELECT on delivery_task_key to notifier_creator":           keysReadByEveryRole,
	"role_table_grant SELECT on delivery_task_key to notifier_operator":          keysReadByEveryRole,
	"role_table_grant SELECT on delivery_task_key to notifier_receiver":          keysReadByEveryRole,
	"role_table_grant SELECT on delivery_task_key to notifier_worker":            keysReadByEveryRole,
	// The two trigger functions have PostgreSQL's default EXECUTE for PUBLIC, like every trigger
	// function of v0; a trigger function cannot be called directly.
	"privilege of notifier_creator on function delivery_task_key_fixed()":   keyTriggerFunctionPublic,
	"privilege of notifier_creator on function delivery_task_key_insert()":  keyTriggerFunctionPublic,
	"privilege of notifier_operator on function delivery_task_key_fixed()":  keyTriggerFunctionPublic,
	"privilege of notifier_operator on function delivery_task_key_insert()": keyTriggerFunctionPublic,
	"privilege of notifier_receiver on function delivery_task_key_fixed()":  keyTriggerFunctionPublic,
	"privilege of notifier_receiver on function delivery_task_key_insert()": keyTriggerFunctionPublic,
	"privilege of notifier_worker on function delivery_task_key_fixed()":    keyTriggerFunctionPublic,
	"privilege of notifier_worker on function delivery_task_key_insert()":   keyTriggerFunctionPublic,
	// notifier_cancel finds the notification's tasks through delivery_task_key (schema/005).
	"function notifier_cancel(text,text,text)": cancelThroughKeys,
	// A fix found while auditing v1: the fast path let fallback_position change (schema/003).
	"function delivery_task_state_machine()":            fallbackFixedOnFastPath,
	"trigger delivery_task.delivery_task_state_machine": fallbackFixedOnFastPath,
	// The attempt's finish made HOT: the ids of a task's attempts that the task does not carry are found
	// through delivery_task_provider_msg, not an index on delivery_attempt (schema/001, 003).
	"column delivery_task_provider_msg.provider_msg_id":                                      providerMsgTable,
	"column delivery_task_provider_msg.task_id":                                              providerMsgTable,
	"constraint delivery_task_provider_msg.delivery_task_provider_msg_pkey":                  providerMsgTable,
	"constraint delivery_task_provider_msg.delivery_task_provider_msg_provider_msg_id_check": providerMsgTable,
	"constraint delivery_task_provider_msg.delivery_task_provider_msg_task_id_fkey":          providerMsgTable,
	"function delivery_attempt_provider_msg_record()":                                        providerMsgTriggers,
	"function delivery_task_provider_msg_fixed()":                                            providerMsgTriggers,
	"function delivery_task_provider_msg_replaced()":                                         providerMsgTriggers,
	"grant SELECT on table delivery_task_provider_msg to notifier_operator":                  providerMsgReadAsAttempts,
	"grant SELECT on table delivery_task_provider_msg to notifier_receiver":                  providerMsgReadAsAttempts,
	"grant SELECT on table delivery_task_provider_msg to notifier_worker":                    providerMsgReadAsAttempts,
	"index delivery_attempt_provider_msg_idx":                                                attemptFinishHOT,
	"index delivery_task_provider_msg_pkey":                                                  providerMsgTable,
	"index delivery_task_provider_msg_task_idx":                                              providerMsgTable,
	"policy delivery_task_provider_msg.delivery_task_provider_msg_operator_select":           providerMsgReadAsAttempts,
	"policy delivery_task_provider_msg.delivery_task_provider_msg_receiver_select":           providerMsgReadAsAttempts,
	"policy delivery_task_provider_msg.delivery_task_provider_msg_worker_select":             providerMsgReadAsAttempts,
	"privilege of notifier_creator on column delivery_task_provider_msg.provider_msg_id":     providerMsgReadAsAttempts,
	"privilege of notifier_creator on column delivery_task_provider_msg.task_id":             providerMsgReadAsAttempts,
	"privilege of notifier_creator on function delivery_attempt_provider_msg_record()":       providerMsgFunctionPublic,
	"privilege of notifier_creator on function delivery_task_provider_msg_fixed()":           providerMsgFunctionPublic,
	"privilege of notifier_creator on function delivery_task_provider_msg_replaced()":        providerMsgFunctionPublic,
	"privilege of notifier_creator on table delivery_task_provider_msg":                      providerMsgReadAsAttempts,
	"privilege of notifier_operator on column delivery_task_provider_msg.provider_msg_id":    providerMsgReadAsAttempts,
	"privilege of notifier_operator on column delivery_task_provider_msg.task_id":            providerMsgReadAsAttempts,
	"privilege of notifier_operator on function delivery_attempt_provider_msg_record()":      providerMsgFunctionPublic,
	"privilege of notifier_operator on function delivery_task_provider_msg_fixed()":          providerMsgFunctionPublic,
	"privilege of notifier_operator on function delivery_task_provider_msg_replaced()":       providerMsgFunctionPublic,
	"privilege of notifier_operator on table delivery_task_provider_msg":                     providerMsgReadAsAttempts,
	"privilege of notifier_receiver on column delivery_task_provider_msg.provider_msg_id":    providerMsgReadAsAttempts,
	"privilege of notifier_receiver on column delivery_task_provider_msg.task_id":            providerMsgReadAsAttempts,
	"privilege of notifier_receiver on function delivery_attempt_provider_msg_record()":      providerMsgFunctionPublic,
	"privilege of notifier_receiver on function delivery_task_provider_msg_fixed()":          providerMsgFunctionPublic,
	"privilege of notifier_receiver on function delivery_task_provider_msg_replaced()":       providerMsgFunctionPublic,
	"privilege of notifier_receiver on table delivery_task_provider_msg":                     providerMsgReadAsAttempts,
	"privilege of notifier_worker on column delivery_task_provider_msg.provider_msg_id":      providerMsgReadAsAttempts,
	"privilege of notifier_worker on column delivery_task_provider_msg.task_id":              providerMsgReadAsAttempts,
	"privilege of notifier_worker on function delivery_attempt_provider_msg_record()":        providerMsgFunctionPublic,
	"privilege of notifier_worker on function delivery_task_provider_msg_fixed()":            providerMsgFunctionPublic,
	"privilege of notifier_worker on function delivery_task_provider_msg_replaced()":         providerMsgFunctionPublic,
	"privilege of notifier_worker on table delivery_task_provider_msg":                       providerMsgReadAsAttempts,
	"role_table_grant SELECT on delivery_task_provider_msg to notifier_operator":             providerMsgReadAsAttempts,
	"role_table_grant SELECT on delivery_task_provider_msg to notifier_receiver":             providerMsgReadAsAttempts,
	"role_table_grant SELECT on delivery_task_provider_msg to notifier_worker":               providerMsgReadAsAttempts,
	"table delivery_attempt":                                                    attemptFinishHOT,
	"table delivery_attempt_provider_msg_idx":                                   attemptFinishHOT,
	"table delivery_task_provider_msg":                                          providerMsgTable,
	"table delivery_task_provider_msg_pkey":                                     providerMsgTable,
	"table delivery_task_provider_msg_task_idx":                                 providerMsgTable,
	"trigger delivery_attempt.delivery_attempt_provider_msg_insert":             providerMsgTriggers,
	"trigger delivery_attempt.delivery_attempt_provider_msg_update":             providerMsgTriggers,
	"trigger delivery_task.delivery_task_provider_msg_replaced":                 providerMsgTriggers,
	"trigger delivery_task_provider_msg.delivery_task_provider_msg_fixed":       providerMsgTriggers,
	"trigger delivery_task_provider_msg.delivery_task_provider_msg_no_truncate": providerMsgTriggers,
}

// TestV1BaselineMatchesV0Migrations migrates one database with testdata/schema-v0 (the migrations
// 001-029 as they were when v1 replaced them) and one with schema/, and compares their catalogs.
func TestV1BaselineMatchesV0Migrations(t *testing.T) {
	is := is.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := pgtest.RepoRoot()
	is.NoErr(err)

	// v0 first: it creates the roles the cluster shares; v1 must then find them (as on a cluster
	// where another database migrated first).
	v0 := catalogOf(ctx, t, filepath.Join(root, "testdata", "schema-v0"))
	dir, err := pgtest.MigrationsDir()
	is.NoErr(err)
	v1 := catalogOf(ctx, t, dir)

	var unexpected, allowed []string
	for _, key := range unionKeys(v0, v1) {
		want, inV0 := v0[key]
		got, inV1 := v1[key]
		for _, r := range renamedFiles {
			want = strings.ReplaceAll(want, r.old, r.new)
		}
		var diff string
		switch {
		case !inV1:
			diff = fmt.Sprintf("%s: only in v0:\n    %s", key, want)
		case !inV0:
			diff = fmt.Sprintf("%s: only in v1:\n    %s", key, got)
		case want != got:
			diff = fmt.Sprintf("%s:\n%s", key, firstDifference(want, got))
		default:
			continue
		}
		if reason, ok := allowedDifferences[key]; ok {
			allowed = append(allowed, diff+"\n    allowed: "+reason)
			continue
		}
		unexpected = append(unexpected, diff)
	}
	for _, d := range allowed {
		t.Log(d)
	}
	for key := range allowedDifferences {
		if v0[key] == v1[key] {
			t.Errorf("allowedDifferences[%q]: v0 and v1 agree: remove it", key)
		}
	}
	if len(unexpected) > 0 {
		t.Errorf("%d differences between the catalogs of testdata/schema-v0 and schema/ not in allowedDifferences:\n%s",
			len(unexpected), strings.Join(unexpected, "\n"))
	}
	is.True(len(v0) > 100) // the catalog queries found the schema
}

// firstDifference shows where two definitions part: the first line that differs, with its number.
func firstDifference(v0, v1 string) string {
	a, b := strings.Split(v0, "\n"), strings.Split(v1, "\n")
	for i := 0; ; i++ {
		var la, lb string
		if i < len(a) {
			la = a[i]
		}
		if i < len(b) {
			lb = b[i]
		}
		if la != lb || i >= len(a) || i >= len(b) {
			return fmt.Sprintf("    line %d of v0: %s\n    line %d of v1: %s", i+1, la, i+1, lb)
		}
	}
}

func unionKeys(a, b map[string]string) []string {
	seen := map[string]bool{}
	for k := range a {
		seen[k] = true
	}
	for k := range b {
		seen[k] = true
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// roles are the four roles of schema/002_roles_and_row_security.sql, whose effective privileges are
// compared object by object (has_*_privilege), beside the grants themselves (aclexplode).
const roles = `ARRAY['notifier_creator', 'notifier_worker', 'notifier_operator', 'notifier_receiver']`

// catalogQueries each return (key, definition) rows: one row per object or per fact about one. Only
// schema public, without dbmate's schema_migrations.
var catalogQueries = map[string]string{
	"tables": `
		SELECT 'table ' || c.relname,
		       format('kind=%s persistence=%s options=%s rowsecurity=%s forcerowsecurity=%s comment=%s',
		              c.relkind, c.relpersistence, c.reloptions, c.relrowsecurity, c.relforcerowsecurity,
		              obj_description(c.oid, 'pg_class'))
		FROM pg_class c
		WHERE c.relnamespace = 'public'::regnamespace AND c.relname <> 'schema_migrations'`,
	"columns": `
		SELECT format('column %s.%s', c.relname, a.attname),
		       format('position=%s type=%s collation=%s notnull=%s default=%s identity=%s generated=%s comment=%s',
		              row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum), format_type(a.atttypid, a.atttypmod),
		              co.collname, a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
		              col_description(c.oid, a.attnum))
		FROM pg_class c
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
		LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
		  AND c.relname <> 'schema_migrations'`,
	"constraints": `
		SELECT format('constraint %s.%s', coalesce(c.relname, ty.typname), k.conname),
		       format('%s deferrable=%s deferred=%s validated=%s comment=%s', pg_get_constraintdef(k.oid, true),
		              k.condeferrable, k.condeferred, k.convalidated, obj_description(k.oid, 'pg_constraint'))
		FROM pg_constraint k
		LEFT JOIN pg_class c ON c.oid = k.conrelid
		LEFT JOIN pg_type ty ON ty.oid = k.contypid
		WHERE k.connamespace = 'public'::regnamespace AND coalesce(c.relname, '') <> 'schema_migrations'`,
	"indexes": `
		SELECT 'index ' || i.indexname, i.indexdef
		FROM pg_indexes i
		WHERE i.schemaname = 'public' AND i.tablename <> 'schema_migrations'`,
	"triggers": `
		SELECT format('trigger %s.%s', c.relname, g.tgname),
		       format('%s enabled=%s comment=%s', pg_get_triggerdef(g.oid, true), g.tgenabled,
		              obj_description(g.oid, 'pg_trigger'))
		FROM pg_trigger g
		JOIN pg_class c ON c.oid = g.tgrelid
		WHERE c.relnamespace = 'public'::regnamespace AND NOT g.tgisinternal`,
	"policies": `
		SELECT format('policy %s.%s', p.tablename, p.policyname),
		       format('%s %s to=%s using=%s check=%s', p.permissive, p.cmd, p.roles, p.qual, p.with_check)
		FROM pg_policies p
		WHERE p.schemaname = 'public'`,
	"functions": `
		SELECT 'function ' || p.oid::regprocedure::text,
		       format('%s comment=%s', pg_get_functiondef(p.oid), obj_description(p.oid, 'pg_proc'))
		FROM pg_proc p
		WHERE p.pronamespace = 'public'::regnamespace`,
	"domains": `
		SELECT 'domain ' || t.typname,
		       format('base=%s notnull=%s default=%s collation=%s comment=%s',
		              format_type(t.typbasetype, t.typtypmod), t.typnotnull, t.typdefault, t.typcollation,
		              obj_description(t.oid, 'pg_type'))
		FROM pg_type t
		WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('d', 'e', 'c', 'r', 'm')
		  AND NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')`,
	"sequences": `
		SELECT 'sequence ' || s.sequencename,
		       format('type=%s start=%s min=%s max=%s increment=%s cycle=%s cache=%s owner=%s',
		              s.data_type, s.start_value, s.min_value, s.max_value, s.increment_by, s.cycle, s.cache_size,
		              (SELECT format('%s.%s', oc.relname, oa.attname) FROM pg_depend dp
		               JOIN pg_class oc ON oc.oid = dp.refobjid
		               JOIN pg_attribute oa ON oa.attrelid = dp.refobjid AND oa.attnum = dp.refobjsubid
		               WHERE dp.objid = (quote_ident(s.schemaname) || '.' || quote_ident(s.sequencename))::regclass
		                 AND dp.classid = 'pg_class'::regclass AND dp.refclassid = 'pg_class'::regclass))
		FROM pg_sequences s
		WHERE s.schemaname = 'public'`,
	"extensions": `
		SELECT 'extension ' || e.extname, e.extversion FROM pg_extension e`,
	// The grants as written, one row per grantee and privilege (the ACLs' text depends on the order of
	// the GRANTs).
	"table grants": `
		SELECT format('grant %s on table %s to %s', a.privilege_type, c.relname, a.grantee::regrole),
		       format('grantable=%s', a.is_grantable)
		FROM pg_class c, aclexplode(c.relacl) a
		WHERE c.relnamespace = 'public'::regnamespace AND c.relname <> 'schema_migrations'
		  AND a.grantee <> c.relowner`,
	"column grants": `
		SELECT format('grant %s on column %s.%s to %s', a.privilege_type, c.relname, at.attname, a.grantee::regrole),
		       format('grantable=%s', a.is_grantable)
		FROM pg_class c
		JOIN pg_attribute at ON at.attrelid = c.oid AND at.attnum > 0 AND NOT at.attisdropped,
		     aclexplode(at.attacl) a
		WHERE c.relnamespace = 'public'::regnamespace`,
	"function grants": `
		SELECT format('grant %s on function %s to %s', a.privilege_type, p.oid::regprocedure,
		              CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END),
		       format('grantable=%s', a.is_grantable)
		FROM pg_proc p, aclexplode(p.proacl) a
		WHERE p.pronamespace = 'public'::regnamespace AND a.grantee <> p.proowner`,
	"schema grants": `
		SELECT format('grant %s on schema public to %s', a.privilege_type,
		              CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END),
		       format('grantable=%s', a.is_grantable)
		FROM pg_namespace n, aclexplode(n.nspacl) a
		WHERE n.nspname = 'public' AND a.grantee <> n.nspowner`,
	"role_table_grants": `
		SELECT format('role_table_grant %s on %s to %s', g.privilege_type, g.table_name, g.grantee),
		       format('grantable=%s hierarchy=%s', g.is_grantable, g.with_hierarchy)
		FROM information_schema.role_table_grants g
		WHERE g.table_schema = 'public' AND g.grantee = ANY (` + roles + `)`,
	"routine_privileges": `
		SELECT format('routine_privilege %s on %s to %s', g.privilege_type, g.routine_name, g.grantee),
		       format('grantable=%s', g.is_grantable)
		FROM information_schema.routine_privileges g
		WHERE g.routine_schema = 'public' AND g.grantee = ANY (` + roles + `)`,
	// What each role may effectively do, whichever grant gives it.
	"effective table privileges": `
		SELECT format('privilege of %s on table %s', r, c.relname),
		       (SELECT string_agg(p, ',' ORDER BY p) FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE',
		                 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p WHERE has_table_privilege(r, c.oid, p))
		FROM pg_class c, unnest(` + roles + `) r
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
		  AND c.relname <> 'schema_migrations'`,
	"effective column privileges": `
		SELECT format('privilege of %s on column %s.%s', r, c.relname, a.attname),
		       (SELECT string_agg(p, ',' ORDER BY p) FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) p
		        WHERE has_column_privilege(r, c.oid, a.attnum, p))
		FROM pg_class c
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped,
		     unnest(` + roles + `) r
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> 'schema_migrations'`,
	"effective function privileges": `
		SELECT format('privilege of %s on function %s', r, p.oid::regprocedure),
		       has_function_privilege(r, p.oid, 'EXECUTE')::text
		FROM pg_proc p, unnest(` + roles + `) r
		WHERE p.pronamespace = 'public'::regnamespace`,
	"effective schema privileges": `
		SELECT format('privilege of %s on schema public', r),
		       format('usage=%s create=%s', has_schema_privilege(r, 'public', 'USAGE'), has_schema_privilege(r, 'public', 'CREATE'))
		FROM unnest(` + roles + `) r`,
}

// catalogOf migrates a new empty database with the migrations of dir and reads its catalog.
func catalogOf(ctx context.Context, t *testing.T, dir string) map[string]string {
	t.Helper()
	url := pgtest.NewEmptyDBURL(t)
	if err := pgtest.MigrateDir(ctx, url, dir); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	catalog := map[string]string{}
	for name, sql := range catalogQueries {
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			t.Fatalf("%s: catalog query %q: %v", dir, name, err)
		}
		for rows.Next() {
			var key string
			var def *string
			if err := rows.Scan(&key, &def); err != nil {
				t.Fatalf("%s: catalog query %q: %v", dir, name, err)
			}
			if _, dup := catalog[key]; dup {
				t.Fatalf("%s: catalog query %q: key %q twice", dir, name, key)
			}
			catalog[key] = "<null>"
			if def != nil {
				catalog[key] = *def
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: catalog query %q: %v", dir, name, err)
		}
	}
	return catalog
}
