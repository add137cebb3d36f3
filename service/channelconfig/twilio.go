package channelconfig

import (
	"errors"
	"strings"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/twilio"
)

// KindTwilio is SMS through Twilio's Messaging API (service/twilio): no idempotency key, no lookup by
// our reference, so mode none; status callbacks to notifier receipts settle a parked task.
const KindTwilio = "twilio"

type twilioConfig struct {
	AccountSID          string `toml:"account_sid"`
	APIKeySID           string `toml:"api_key_sid"`
	AuthTokenEnv        string `toml:"auth_token_env"`
	AuthTokenFile       string `toml:"auth_token_file"`
	From                string `toml:"from"`
	MessagingServiceSID string `toml:"messaging_service_sid"`
	StatusCallbackURL   string `toml:"status_callback_url"`
	BaseURL             string `toml:"base_url"`
	CAFile              string `toml:"ca_file"`
}

func init() {
	register(kind{
		name:   KindTwilio,
		modes:  []delivery.Mode{delivery.ModeNone},
		offers: "offers neither idempotency keys nor a lookup by our reference: want none (status callbacks settle parked tasks)",
		// Twilio does not promise that a 5xx comes before it queued the message; its 429 (error 20429)
		// it does: "Requests that receive 429 responses aren't processed and are safe to retry after
		// backing off" (https://www.twilio.com/docs/api/errors/20429).
		defaults: delivery.Contract{ServerErrorsUncertain: true, ThrottleRefuses: true},
	}, func(l loader, c *twilioConfig) (delivery.Channel, error) {
		if c.AccountSID == "" {
			return nil, errors.New("account_sid: required (AC..., the account the messages are sent from)")
		}
		secretName := "auth_token"
		secret, err := l.secret(secretName, c.AuthTokenEnv, c.AuthTokenFile)
		if err != nil {
			return nil, err
		}
		if (c.From == "") == (c.MessagingServiceSID == "") {
			return nil, errors.New("from or messaging_service_sid: give exactly one")
		}
		if c.StatusCallbackURL == "" {
			return nil, errors.New("status_callback_url: required (the public URL of notifier receipts' /receipts/twilio: Twilio's status callbacks settle what a lost answer left parked)")
		}
		client, err := twilio.New(twilio.Options{AccountSID: c.AccountSID, Username: c.APIKeySID, Password: secret,
			From: c.From, MessagingServiceSID: c.MessagingServiceSID, StatusCallbackURL: c.StatusCallbackURL,
			BaseURL: c.BaseURL, CAFile: l.path(c.CAFile)})
		if err != nil {
			return nil, keyErr("twilio", errors.New(strings.ReplaceAll(err.Error(), secret, "[redacted]")))
		}
		return client, nil
	})
}
