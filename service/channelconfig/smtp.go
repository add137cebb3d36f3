package channelconfig

import (
	"errors"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/smtpchannel"
)

// KindSMTP is a mail submission server: no keys, no queries.
const KindSMTP = "smtp"

type smtpConfig struct {
	Addr            string `toml:"addr"`
	CAFile          string `toml:"ca_file"`
	StartTLS        string `toml:"starttls"`
	Username        string `toml:"username"`
	PasswordEnv     string `toml:"password_env"`
	PasswordFile    string `toml:"password_file"`
	From            string `toml:"from"`
	HeloName        string `toml:"helo_name"`
	MessageIDDomain string `toml:"message_id_domain"`
	SubjectPrefix   string `toml:"subject_prefix"`
}

func init() {
	register(kind{
		name:   KindSMTP,
		modes:  []delivery.Mode{delivery.ModeNone},
		offers: "offers neither idempotency keys nor queries: want none",
	}, func(l loader, c *smtpConfig) (delivery.Channel, error) {
		if c.Addr == "" || c.From == "" {
			return nil, errors.New("addr and from: required for kind smtp")
		}
		var password string
		if c.Username != "" || c.PasswordEnv != "" || c.PasswordFile != "" {
			if c.Username == "" {
				return nil, errors.New("username: required with password_env/password_file")
			}
			var err error
			if password, err = l.secret("password", c.PasswordEnv, c.PasswordFile); err != nil {
				return nil, err
			}
		}
		mode, err := smtpchannel.ParseTLSMode(c.StartTLS)
		if err != nil {
			return nil, keyErr("", err)
		}
		client, err := smtpchannel.New(smtpchannel.Options{Addr: c.Addr, StartTLS: mode, CAFile: l.path(c.CAFile),
			Username: c.Username, Password: password, From: c.From, HeloName: c.HeloName,
			MessageIDDomain: c.MessageIDDomain, SubjectPrefix: c.SubjectPrefix})
		return client, keyErr("smtp", err)
	})
}
