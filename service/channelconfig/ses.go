package channelconfig

import (
	"context"
	"errors"
	"strings"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/ses"
)

// KindSES is email through Amazon SES API v2 (service/ses): no idempotency key, no lookup by our
// reference, so mode none; SES events through SNS to notifier receipts settle a parked task.
const KindSES = "ses"

type sesConfig struct {
	Region              string `toml:"region"`
	From                string `toml:"from"`
	ConfigurationSet    string `toml:"configuration_set"`
	SubjectPrefix       string `toml:"subject_prefix"`
	AccessKeyIDEnv      string `toml:"access_key_id_env"`
	AccessKeyIDFile     string `toml:"access_key_id_file"`
	SecretAccessKeyEnv  string `toml:"secret_access_key_env"`
	SecretAccessKeyFile string `toml:"secret_access_key_file"`
	SessionTokenEnv     string `toml:"session_token_env"`
	SessionTokenFile    string `toml:"session_token_file"`
	Endpoint            string `toml:"endpoint"`
	CAFile              string `toml:"ca_file"`
}

func init() {
	register(kind{
		name:   KindSES,
		modes:  []delivery.Mode{delivery.ModeNone},
		offers: "offers neither idempotency keys nor a lookup by our reference: want none (SES events through SNS settle parked tasks)",
		// SES does not promise that a 5xx comes before it accepted the email. A throttling error it
		// does: past the sending rate or quota "Amazon SES drops the message and doesn't attempt to
		// redeliver it", and the sender should "wait ... and then retry the send request"
		// (https://docs.aws.amazon.com/ses/latest/dg/manage-sending-quotas-errors.html).
		defaults: delivery.Contract{ServerErrorsUncertain: true, ThrottleRefuses: true},
	}, func(l loader, c *sesConfig) (delivery.Channel, error) {
		if c.Region == "" {
			return nil, errors.New("region: required (the SES region of the sending identity, e.g. eu-west-1)")
		}
		if c.From == "" {
			return nil, errors.New("from: required (an identity verified in SES)")
		}
		opt := ses.Options{Region: c.Region, From: c.From, ConfigurationSet: c.ConfigurationSet,
			SubjectPrefix: c.SubjectPrefix, Endpoint: c.Endpoint, CAFile: l.path(c.CAFile)}
		keyGiven := c.AccessKeyIDEnv != "" || c.AccessKeyIDFile != ""
		secretGiven := c.SecretAccessKeyEnv != "" || c.SecretAccessKeyFile != ""
		switch {
		case keyGiven != secretGiven:
			return nil, errors.New("access_key_id_env/_file and secret_access_key_env/_file: give both, or neither for the AWS SDK's default credential chain")
		case keyGiven:
			var err error
			if opt.AccessKeyID, err = l.secret("access_key_id", c.AccessKeyIDEnv, c.AccessKeyIDFile); err != nil {
				return nil, err
			}
			if opt.SecretAccessKey, err = l.secret("secret_access_key", c.SecretAccessKeyEnv, c.SecretAccessKeyFile); err != nil {
				return nil, err
			}
			if c.SessionTokenEnv != "" || c.SessionTokenFile != "" {
				if opt.SessionToken, err = l.secret("session_token", c.SessionTokenEnv, c.SessionTokenFile); err != nil {
					return nil, err
				}
			}
		case c.SessionTokenEnv != "" || c.SessionTokenFile != "":
			return nil, errors.New("session_token_env/_file: only with access_key_id_env/_file and secret_access_key_env/_file")
		}
		client, err := ses.New(context.Background(), opt)
		if err != nil {
			msg := err.Error()
			for _, s := range []string{opt.SecretAccessKey, opt.SessionToken} {
				if s != "" {
					msg = strings.ReplaceAll(msg, s, "[redacted]")
				}
			}
			return nil, keyErr("ses", errors.New(msg))
		}
		return client, nil
	})
}
