// Package terraform holds rtcedge's Terraform modules and examples (HCL for
// the Cloudflare v5 and Kubernetes providers): cloudflare-steering, region,
// pop, and examples/two-regions. There is no Go code here; the package exists
// so that `go test ./terraform` parses every .tf file and checks, without
// Terraform, that variables, locals, module arguments and module outputs
// referenced anywhere are declared. See docs/deploy.md.
package terraform
