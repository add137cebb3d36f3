// Package service is notifier on PostgreSQL: the Notifier (create, preferences, resolve, receipts,
// reads, retention) and the Dispatcher (claim, call, finish), which turn the decisions of
// service/delivery into transactions. The protocol's vocabulary (states, modes, outcomes, messages,
// receipts, routes) is named once, in service/delivery, which has no database dependency so the channel
// adapters, channelconfig and receipts build on it without importing this package. Generated query
// code stays in dbgen; callers of this package see only domain types.
package service

// TaskRef names one delivery task of a notification: its id here, and the reference the channel sees
// (random, never reused; a provider's console or receipt shows it, as ntf-<ref> where a key is sent).
type TaskRef struct {
	TaskID  int64  `json:"task_id"`
	Channel string `json:"channel"`
	Ref     string `json:"ref"`
}
