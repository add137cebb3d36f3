package service

import (
	"context"
	"errors"
	"fmt"
	"github.com/notifierhq/notifier/service/delivery"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/notifierhq/notifier/dbgen"
)

// ValidateReceipt checks a receipt before anything is written.
func ValidateReceipt(r delivery.Receipt) error {
	switch r.Source {
	case delivery.ReceiptSourceStandardWebhooks, delivery.ReceiptSourceTwilio, delivery.ReceiptSourcePostmark, delivery.ReceiptSourceSES:
	default:
		return &delivery.InputError{Field: "receipt source", Reason: fmt.Sprintf("%q is not one this service verifies", r.Source)}
	}
	switch r.Kind {
	case delivery.ReceiptAccepted, delivery.ReceiptDelivered, delivery.ReceiptBounced, delivery.ReceiptComplained, delivery.ReceiptUndelivered:
	default:
		return &delivery.InputError{Field: "receipt kind", Reason: fmt.Sprintf("%q is not a receipt kind", r.Kind)}
	}
	if r.HardBounce && r.Kind != delivery.ReceiptBounced {
		return &delivery.InputError{Field: "receipt", Reason: "a hard bounce is a BOUNCED receipt"}
	}
	if err := checkPrintable("receipt event id", r.EventID, MaxIDLength); err != nil {
		return err
	}
	if r.Ref != "" {
		if _, ok := delivery.ParseRef(r.Ref); !ok {
			return &delivery.InputError{Field: "receipt reference", Reason: fmt.Sprintf("%q is not a reference of ours", r.Ref)}
		}
	}
	if r.Ref == "" && r.ProviderMsgID == "" {
		return &delivery.InputError{Field: "receipt", Reason: "it carries neither our reference nor the provider's message id"}
	}
	if r.ProviderMsgID != "" {
		return checkPrintable("receipt message id", r.ProviderMsgID, 500)
	}
	return nil
}

func checkPrintable(field, s string, max int) error {
	if s == "" || utf8.RuneCountInString(s) > max || !utf8.ValidString(s) {
		return &delivery.InputError{Field: field, Reason: fmt.Sprintf("want 1 to %d characters of valid UTF-8", max)}
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return &delivery.InputError{Field: field, Reason: "holds a control character"}
		}
	}
	return nil
}

// RecordReceipt records a verified provider receipt and applies it to its task, in one transaction:
// the task is found by our reference, else by the provider's message id (none: ErrUnknownReference;
// more than one: ErrAmbiguousReference; nothing written either way); notifier_apply_receipt settles it as
// SENT when nobody holds it, notes it when a holder is calling, and never moves a final state; the
// receipt row keeps what came and what it did. A receipt already recorded (same source and event id)
// changes nothing and reports Duplicate. With disableOnBounce a hard bounce switches the user's
// preference on that channel off.
func (n *Notifier) RecordReceipt(ctx context.Context, r delivery.Receipt, disableOnBounce bool) (delivery.ReceiptResult, error) {
	if err := ValidateReceipt(r); err != nil {
		return delivery.ReceiptResult{}, err
	}
	var res delivery.ReceiptResult
	err := inTx(ctx, n.pool, func(q *dbgen.Queries) error {
		id, err := matchReceipt(ctx, q, r)
		if err != nil {
			return err
		}
		res = delivery.ReceiptResult{TaskID: id}
		applied, err := q.ReceiptApply(ctx, dbgen.ReceiptApplyParams{TaskID: id, ProviderMsgID: optional(r.ProviderMsgID),
			Note: delivery.Truncate(fmt.Sprintf("receipt %s %s: %s", r.Source, r.EventID, r.Kind), MaxNoteLength)})
		if errors.Is(err, pgx.ErrNoRows) {
			return delivery.ErrUnknownReference // no such task (never was, or pruned since matching); nothing written
		}
		if err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		res.Effect, res.State = delivery.ReceiptEffect(applied.Effect), delivery.State(applied.State)
		var occurred *time.Time
		if !r.OccurredAt.IsZero() {
			occurred = &r.OccurredAt
		}
		_, err = q.ReceiptInsert(ctx, dbgen.ReceiptInsertParams{
			TaskID: id, Source: r.Source, EventID: r.EventID, Kind: string(r.Kind), HardBounce: r.HardBounce,
			Effect: applied.Effect, ProviderMsgID: optional(r.ProviderMsgID), OccurredAt: occurred,
			Detail: optional(delivery.Truncate(r.Detail, MaxNoteLength)),
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return errDuplicateReceipt // roll back what applying it did: it was applied the first time
		}
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if disableOnBounce && r.HardBounce {
			_, err := q.PrefDisableByTask(ctx, id)
			switch {
			case err == nil:
				res.PrefDisabled = true
			case !errors.Is(err, pgx.ErrNoRows):
				return fmt.Errorf("disable the bounced preference: %w", err)
			}
		}
		return nil
	})
	if errors.Is(err, errDuplicateReceipt) {
		return delivery.ReceiptResult{TaskID: res.TaskID, Duplicate: true}, nil
	}
	if err != nil {
		return delivery.ReceiptResult{}, n.refused("record receipt", RoleReceiver, fmt.Errorf("record receipt %s %s: %w", r.Source, r.EventID, err))
	}
	return res, nil
}

var errDuplicateReceipt = errors.New("receipt already recorded")

// matchReceipt finds the task a receipt is about.
func matchReceipt(ctx context.Context, q *dbgen.Queries, r delivery.Receipt) (int64, error) {
	if r.Ref != "" {
		ref, _ := delivery.ParseRef(r.Ref) // checked by ValidateReceipt
		id, err := q.ReceiptTaskByRef(ctx, ref)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return 0, delivery.ErrUnknownReference
		case err != nil:
			return 0, fmt.Errorf("match: %w", err)
		}
		return id, nil
	}
	ids, err := q.ReceiptTasksByProviderMsgID(ctx, r.ProviderMsgID)
	switch {
	case err != nil:
		return 0, fmt.Errorf("match: %w", err)
	case len(ids) == 0:
		return 0, delivery.ErrUnknownReference
	case len(ids) > 1:
		return 0, delivery.ErrAmbiguousReference
	}
	return ids[0], nil
}

// SweepReceipts settles, up to limit at a time, the tasks whose receipt arrived while a holder was
// calling and that nobody holds any more (notifier receipts runs it every few seconds). It reports how
// many became SENT.
func (n *Notifier) SweepReceipts(ctx context.Context, limit int) (int, error) {
	rows, err := n.q.ReceiptSweep(ctx, int32(limit))
	if err != nil {
		return 0, fmt.Errorf("sweep receipts: %w", err)
	}
	settled := 0
	for _, r := range rows {
		if delivery.ReceiptEffect(r.Effect) == delivery.ReceiptSettled {
			settled++
		}
	}
	return settled, nil
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
