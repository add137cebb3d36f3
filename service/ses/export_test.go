package ses

import "github.com/aws/aws-sdk-go-v2/aws"

// WithRetryer sets the SDK retryer: only the negative control uses it, to show the damage the
// default retryer does.
func WithRetryer(o Options, r aws.Retryer) Options { o.retryer = r; return o }
