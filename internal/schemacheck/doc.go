// Package schemacheck holds the test that proves the v1 baseline of schema/ builds the same database
// as the migrations it replaced (testdata/schema-v0/): it migrates one database with each, both with
// dbmate, and compares their catalogs object by object (schemacheck_test.go). Every difference is
// listed; one not in the test's commented allow-list fails it. docs/protocol.md#schema-v1 explains
// each allowed difference.
package schemacheck
