package channelconfig

import (
	"errors"
	"strings"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/resend"
)

// KindResend is email through Resend's API (service/resend): idempotent by Idempotency-Key, keys kept
// 24 hours; no lookup by our reference.
const KindResend = "resend"

type resendConfig struct {
	APIKeyEnv     string `toml:"api_key_env"`
	APIKeyFile    string `toml:"api_key_file"`
	From          string `toml:"from"`
	SubjectPrefix string `toml:"subject_prefix"`
	BaseURL       string `toml:"base_url"`
	CAFile        string `toml:"ca_file"`
}

func init() {
	register(kind{
		name:         KindResend,
		modes:        []delivery.Mode{delivery.ModeIdempotent, delivery.ModeNone},
		offers:       "offers idempotency keys (24 hours) but no lookup by reference: want idempotent or none",
		contractKeys: []string{"idempotency_window"},
		// Resend documents the key's 24 hours (the window ends early enough that a resend arrives inside
		// them: resend.IdempotencyWindow), and neither that a 5xx nor that a 429 comes before acceptance:
		// no ThrottleRefuses (docs/channels.md#resend).
		defaults: delivery.Contract{IdempotencyWindow: resend.IdempotencyWindow, ServerErrorsUncertain: true},
	}, func(l loader, c *resendConfig) (delivery.Channel, error) {
		key, err := l.secret("api_key", c.APIKeyEnv, c.APIKeyFile)
		if err != nil {
			return nil, err
		}
		if c.From == "" {
			return nil, errors.New("from: required (a sender on a domain verified at Resend)")
		}
		client, err := resend.New(resend.Options{APIKey: key, From: c.From, SubjectPrefix: c.SubjectPrefix,
			BaseURL: c.BaseURL, CAFile: l.path(c.CAFile)})
		if err != nil {
			return nil, keyErr("", redactKey(err, key))
		}
		return client, nil
	})
}

// redactKey keeps a secret out of a constructor's error, should one ever quote its input.
func redactKey(err error, secret string) error {
	if err == nil || secret == "" {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), secret, "[redacted]"))
}
