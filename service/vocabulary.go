package service

// The protocol's vocabulary (service/delivery) under this package's names, so that callers of the
// service need one import. Generated from delivery's exported declarations; keep the two in step.

import "github.com/notifierhq/notifier/service/delivery"

type (
	ReceiptKind   = delivery.ReceiptKind
	ReceiptEffect = delivery.ReceiptEffect
	Receipt       = delivery.Receipt
	ReceiptResult = delivery.ReceiptResult
	Route         = delivery.Route
	RateLimit     = delivery.RateLimit
	Action        = delivery.Action
	Backoff       = delivery.Backoff
	Channel       = delivery.Channel
	ClaimDecision = delivery.ClaimDecision
	ClaimFacts    = delivery.ClaimFacts
	ClaimKind     = delivery.ClaimKind
	Contract      = delivery.Contract
	Facts         = delivery.Facts
	InputError    = delivery.InputError
	Message       = delivery.Message
	Mode          = delivery.Mode
	Observation   = delivery.Observation
	Outcome       = delivery.Outcome
	State         = delivery.State
	Transition    = delivery.Transition
)

const (
	ReceiptAccepted               = delivery.ReceiptAccepted
	ReceiptDelivered              = delivery.ReceiptDelivered
	ReceiptBounced                = delivery.ReceiptBounced
	ReceiptComplained             = delivery.ReceiptComplained
	ReceiptUndelivered            = delivery.ReceiptUndelivered
	ReceiptSettled                = delivery.ReceiptSettled
	ReceiptNoted                  = delivery.ReceiptNoted
	ReceiptUnchanged              = delivery.ReceiptUnchanged
	ReceiptContradicts            = delivery.ReceiptContradicts
	ReceiptSourceStandardWebhooks = delivery.ReceiptSourceStandardWebhooks
	ReceiptSourceTwilio           = delivery.ReceiptSourceTwilio
	MaxRate                       = delivery.MaxRate
	StatePending                  = delivery.StatePending
	StateSending                  = delivery.StateSending
	StateSent                     = delivery.StateSent
	StateUnknown                  = delivery.StateUnknown
	StateFailed                   = delivery.StateFailed
	StateSuppressed               = delivery.StateSuppressed
	ModeIdempotent                = delivery.ModeIdempotent
	ModeQueryable                 = delivery.ModeQueryable
	ModeNone                      = delivery.ModeNone
	ActionSend                    = delivery.ActionSend
	ActionTopicResend             = delivery.ActionTopicResend
	ActionQuery                   = delivery.ActionQuery
	ActionSkip                    = delivery.ActionSkip
	ActionManual                  = delivery.ActionManual
	ActionReceipt                 = delivery.ActionReceipt
	OutcomeAccepted               = delivery.OutcomeAccepted
	OutcomeAcceptedReplay         = delivery.OutcomeAcceptedReplay
	OutcomeQueryFound             = delivery.OutcomeQueryFound
	OutcomeQueryNotFound          = delivery.OutcomeQueryNotFound
	OutcomeQueryFailed            = delivery.OutcomeQueryFailed
	OutcomeTimeout                = delivery.OutcomeTimeout
	OutcomeIOError                = delivery.OutcomeIOError
	OutcomeConnectFailed          = delivery.OutcomeConnectFailed
	OutcomeInFlight               = delivery.OutcomeInFlight
	OutcomeMalformed              = delivery.OutcomeMalformed
	OutcomeHTTP5xx                = delivery.OutcomeHTTP5xx
	OutcomeGatewayError           = delivery.OutcomeGatewayError
	OutcomeThrottled              = delivery.OutcomeThrottled
	OutcomeRejected               = delivery.OutcomeRejected
	OutcomeLeaseExpired           = delivery.OutcomeLeaseExpired
	OutcomePrefDisabled           = delivery.OutcomePrefDisabled
	OutcomeTTLExpired             = delivery.OutcomeTTLExpired
	OutcomePrefDisabledUncertain  = delivery.OutcomePrefDisabledUncertain
	OutcomeTTLExpiredUncertain    = delivery.OutcomeTTLExpiredUncertain
	OutcomeManualSent             = delivery.OutcomeManualSent
	OutcomeManualFailed           = delivery.OutcomeManualFailed
	OutcomeReceiptAccepted        = delivery.OutcomeReceiptAccepted
	ClaimCall                     = delivery.ClaimCall
	ClaimSettle                   = delivery.ClaimSettle
	ClaimPark                     = delivery.ClaimPark
	ClaimReceipt                  = delivery.ClaimReceipt
)

var (
	ErrUnknownReference   = delivery.ErrUnknownReference
	ErrAmbiguousReference = delivery.ErrAmbiguousReference
	ParseRate             = delivery.ParseRate
	DefaultBurst          = delivery.DefaultBurst
	ErrInvalidInput       = delivery.ErrInvalidInput
	ErrNotFound           = delivery.ErrNotFound
	Decide                = delivery.Decide
	IdempotencyKey        = delivery.IdempotencyKey
	Next                  = delivery.Next
	ParseMode             = delivery.ParseMode
	ParseRef              = delivery.ParseRef
)
