package upload

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// ClientOptions say how to reach the object store. Credentials and, without Endpoint, the
// endpoint come the standard AWS way (environment, shared config and credentials files,
// SSO, web identity, instance metadata) through aws-sdk-go-v2's config loader.
type ClientOptions struct {
	// Endpoint is the S3 API's base URL for stores other than AWS ("http://ceph:7480");
	// empty: AWS's, or AWS_ENDPOINT_URL(_S3) / the profile's endpoint_url.
	Endpoint string
	// Region signs requests; empty: AWS_REGION / the profile's, else "us-east-1".
	Region string
	// PathStyle addresses buckets as endpoint/bucket/key (on-site servers) rather than
	// bucket.endpoint/key. Set whenever an endpoint is given, here or in
	// AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (a daemon the client started has no flags).
	PathStyle bool
	// Profile picks a shared-config profile; empty: AWS_PROFILE or "default".
	Profile string
	// SSE asks the store to encrypt every object strapd writes (stream, checkpoint,
	// tokens, trace, resource log) with its own keys: "AES256" (SSE-S3) or "aws:kms"
	// (SSE-KMS, with SSEKMSKeyID or the account's default key); empty: the bucket's
	// default. The server must confirm it in its answer, or the upload fails (SSE-C,
	// keys the client supplies, is not supported).
	SSE         string
	SSEKMSKeyID string
	// Timeout and MinRate bound every S3 call: a call moving n bytes (a part, a side file,
	// a part read back) must end within Timeout + n/MinRate, else it fails as unanswered
	// and is retried like any failed attempt (a server that hangs instead of refusing).
	// 0: DefaultTimeout and DefaultMinRate.
	Timeout time.Duration
	MinRate int64
}

// The defaults of ClientOptions.Timeout and MinRate: a 16 MiB part gets 46 s.
const (
	DefaultTimeout = 30 * time.Second
	DefaultMinRate = 1 << 20
)

// Server-side encryption algorithms ClientOptions.SSE takes.
const (
	SSEAES256 = "AES256"
	SSEKMS    = "aws:kms"
)

// CheckSSE checks the encryption options.
func (o ClientOptions) CheckSSE() error {
	switch o.SSE {
	case "", SSEAES256, SSEKMS:
	default:
		return fmt.Errorf("server-side encryption %q: expected %s or %s (SSE-C is not supported)", o.SSE, SSEAES256, SSEKMS)
	}
	if o.SSEKMSKeyID != "" && o.SSE != SSEKMS {
		return fmt.Errorf("a KMS key id needs server-side encryption %s", SSEKMS)
	}
	if len(o.SSEKMSKeyID) > 2048 || strings.ContainsAny(o.SSEKMSKeyID, "\x00\r\n") {
		return errors.New("the KMS key id is too long or holds control characters")
	}
	return nil
}

// ErrSSENotConfirmed is an object write whose answer does not confirm the server-side
// encryption asked for: a server that ignores the request would store it unencrypted.
var ErrSSENotConfirmed = errors.New("the server did not confirm server-side encryption")

// Client is the S3 API client strapd uses for uploads and range reads.
type Client struct {
	s3 *s3.Client
	// presign and http send parts over plain HTTP by sendfile (sendfile.go).
	presign *s3.PresignClient
	http    *http.Client
	// sse and kmsKey: ClientOptions.SSE and SSEKMSKeyID.
	sse, kmsKey string
	// floor and rate: ClientOptions.Timeout and MinRate (callTimeout).
	floor time.Duration
	rate  int64
}

// NewClient loads credentials and region the standard way and builds the client. It makes
// no request: a bad endpoint or refused credentials show on the first one.
func NewClient(ctx context.Context, o ClientOptions) (*Client, error) {
	if err := o.CheckSSE(); err != nil {
		return nil, err
	}
	if o.Timeout < 0 || o.MinRate < 0 {
		return nil, fmt.Errorf("S3 call timeout %s and minimum rate %d: expected positive values", o.Timeout, o.MinRate)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MinRate == 0 {
		o.MinRate = DefaultMinRate
	}
	var opts []func(*config.LoadOptions) error
	if o.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(o.Profile))
	}
	if o.Region != "" {
		opts = append(opts, config.WithRegion(o.Region))
	}
	// Retries are the uploader's (with its own backoff and error counts); the SDK's own
	// standard retryer still covers throttling and transient 5xx inside one attempt.
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	hc := &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute, TLSHandshakeTimeout: 10 * time.Second,
		// Buffers of each connection, allocated anew for each (VersityGW closes every
		// connection after one request: a new one per part, PERFORMANCE.md "Upload to object
		// storage"). Parts over plain HTTP bypass the write buffer (sendfile), and a body read
		// into a buffer at least this large bypasses the read buffer; 256 KiB each was 1.8 %
		// of the daemon's CPU during a capture with its upload, in allocation alone.
		WriteBufferSize: 64 << 10, ReadBufferSize: 64 << 10,
	}}
	cfg.HTTPClient = hc
	c := s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		so.UsePathStyle = o.PathStyle || o.Endpoint != "" || os.Getenv("AWS_ENDPOINT_URL_S3") != "" ||
			os.Getenv("AWS_ENDPOINT_URL") != ""
		// Parts carry our own CRC32C (checked by the server); payload SHA-256 signing
		// would cost far more CPU than the capture (PERFORMANCE-DATA.md), so the
		// signature covers the headers and the CRC header, not a payload hash.
		so.APIOptions = append(so.APIOptions, v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)
		// Checksums are asked for explicitly where strapd wants them.
		so.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		so.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	return &Client{s3: c, presign: s3.NewPresignClient(c), http: hc, sse: o.SSE, kmsKey: o.SSEKMSKeyID,
		floor: o.Timeout, rate: o.MinRate}, nil
}

// SSE is the server-side encryption asked for every object written (ClientOptions.SSE).
func (c *Client) SSE() string { return c.sse }

// S3 is the underlying SDK client (tests create buckets with it).
func (c *Client) S3() *s3.Client { return c.s3 }

// Describe turns an SDK error into one line that names what the server refused, with a hint
// for the usual causes (credentials, endpoint, bucket).
func Describe(err error) string {
	if err == nil {
		return ""
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken", "Forbidden":
			return fmt.Sprintf("credentials refused by the server (%s: %s): check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the shared credentials file", ae.ErrorCode(), ae.ErrorMessage())
		case "NoSuchBucket":
			return fmt.Sprintf("no such bucket (%s): create it first", ae.ErrorMessage())
		case "KMS.NotFoundException", "KMS.DisabledException", "KMS.AccessDeniedException", "KMS.KMSInvalidStateException":
			return fmt.Sprintf("the KMS key for server-side encryption was refused (%s: %s): check --s3-sse-kms-key-id and the key's policy", ae.ErrorCode(), ae.ErrorMessage())
		}
		return fmt.Sprintf("%s: %s", ae.ErrorCode(), ae.ErrorMessage())
	}
	return err.Error()
}

// permanent reports whether retrying cannot help without someone changing something
// (credentials, bucket); such errors are still retried, more slowly, and logged as such.
func permanent(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "NoSuchBucket", "InvalidBucketName", "NotImplemented",
			"KMS.NotFoundException", "KMS.DisabledException", "KMS.AccessDeniedException":
			return true
		}
	}
	return errors.Is(err, ErrSSENotConfirmed)
}

// badDigest reports a part refused because its bytes do not match the checksum sent.
func badDigest(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "InvalidChecksum":
			return true
		}
	}
	return false
}

// notFound reports a 404 of the object or the upload.
func notFound(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchUpload", "NoSuchKey", "NotFound":
			return true
		}
	}
	return false
}

// apiCode is an API error's code ("" for other errors).
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// sourceGone reports an object that is not there, or no longer the one asked for (If-Match).
func sourceGone(err error) bool {
	switch apiCode(err) {
	case "NoSuchKey", "NotFound", "PreconditionFailed":
		return true
	}
	return false
}
