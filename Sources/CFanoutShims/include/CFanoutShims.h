// Swift cannot import C function-like macros. OpenSSL 3 spells several of the calls the transport
// needs as macros over SSL_ctrl/BIO_ctrl, so each one is wrapped here as a real function, one line
// each, named CFanoutShims_<original>.
#ifndef C_FANOUT_SHIMS_H
#define C_FANOUT_SHIMS_H

#include <openssl/ssl.h>
#include <openssl/bio.h>
#include <openssl/x509.h>

// SSL_set_tlsext_host_name is a macro over SSL_ctrl (SNI).
int CFanoutShims_SSL_set_tlsext_host_name(SSL *ssl, const char *name);
// SSL_CTX_set_min_proto_version is a macro over SSL_CTX_ctrl (TLS 1.2 floor).
int CFanoutShims_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version);
// SSL_CTX_set_mode is a macro over SSL_CTX_ctrl.
long CFanoutShims_SSL_CTX_set_mode(SSL_CTX *ctx, long mode);
// BIO_set_mem_eof_return is a macro over BIO_ctrl: -1 makes an empty memory BIO mean "retry", not EOF.
long CFanoutShims_BIO_set_mem_eof_return(BIO *bio, int value);
// BIO_pending is a macro over BIO_ctrl: bytes waiting to be read from a memory BIO.
size_t CFanoutShims_BIO_pending(BIO *bio);
// SSL_CTX_set_session_cache_mode is a macro over SSL_CTX_ctrl.
long CFanoutShims_SSL_CTX_set_session_cache_mode(SSL_CTX *ctx, long mode);
// SSL_CTX_set1_groups_list is a macro over SSL_CTX_ctrl.
int CFanoutShims_SSL_CTX_set1_groups_list(SSL_CTX *ctx, const char *list);
// pthread_setname_np is a GNU extension that Glibc's Swift module does not expose: names the calling
// thread (at most 15 bytes) for top -H and /proc/self/task/*/comm.
int CFanoutShims_set_current_thread_name(const char *name);
// malloc_trim (glibc's <malloc.h>, which Glibc's Swift module does not expose): gives the heap's free pages back to
// the kernel, in every arena. Returns 1 if memory was released, 0 otherwise (and always 0 without glibc).
int CFanoutShims_malloc_trim(size_t pad);
// OPENSSL_free is a macro over CRYPTO_free with file/line arguments.
void CFanoutShims_OPENSSL_free(void *pointer);
// X509_get_notBefore / X509_get_notAfter are macros (mutable accessors).
ASN1_TIME *CFanoutShims_X509_getm_notBefore(X509 *x509);
ASN1_TIME *CFanoutShims_X509_getm_notAfter(X509 *x509);
// SSL_CTX_add1_chain_cert is a macro over SSL_CTX_ctrl: adds an intermediate certificate to the chain the context
// presents (a client certificate's chain), taking a reference of its own (the caller keeps its own).
int CFanoutShims_SSL_CTX_add1_chain_cert(SSL_CTX *ctx, X509 *x509);
// sk_X509_num / sk_X509_value / sk_X509_pop_free are type-safe macros over OPENSSL_sk_*: the count of a certificate
// stack, its i-th certificate (borrowed from the stack), and freeing the stack with every certificate in it.
int CFanoutShims_sk_X509_num(const STACK_OF(X509) *stack);
X509 *CFanoutShims_sk_X509_value(const STACK_OF(X509) *stack, int index);
void CFanoutShims_sk_X509_pop_free(STACK_OF(X509) *stack);
// SSL_CTX_set_tlsext_servername_callback is a macro over SSL_CTX_callback_ctrl (unused for now).
// ERR_GET_REASON is an inline function in OpenSSL 3 but was a macro before; wrapped for both.
int CFanoutShims_ERR_GET_REASON(unsigned long error);

#endif
