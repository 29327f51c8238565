#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include "CFanoutShims.h"
#include <openssl/err.h>
#include <openssl/crypto.h>

int CFanoutShims_SSL_set_tlsext_host_name(SSL *ssl, const char *name) { return (int)SSL_set_tlsext_host_name(ssl, name); }
int CFanoutShims_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version) { return (int)SSL_CTX_set_min_proto_version(ctx, version); }
long CFanoutShims_SSL_CTX_set_mode(SSL_CTX *ctx, long mode) { return SSL_CTX_set_mode(ctx, mode); }
long CFanoutShims_BIO_set_mem_eof_return(BIO *bio, int value) { return BIO_set_mem_eof_return(bio, value); }
size_t CFanoutShims_BIO_pending(BIO *bio) { return BIO_pending(bio); }
long CFanoutShims_SSL_CTX_set_session_cache_mode(SSL_CTX *ctx, long mode) { return SSL_CTX_set_session_cache_mode(ctx, mode); }
int CFanoutShims_SSL_CTX_set1_groups_list(SSL_CTX *ctx, const char *list) { return (int)SSL_CTX_set1_groups_list(ctx, list); }
void CFanoutShims_OPENSSL_free(void *pointer) { OPENSSL_free(pointer); }
ASN1_TIME *CFanoutShims_X509_getm_notBefore(X509 *x509) { return X509_getm_notBefore(x509); }
ASN1_TIME *CFanoutShims_X509_getm_notAfter(X509 *x509) { return X509_getm_notAfter(x509); }
int CFanoutShims_SSL_CTX_add1_chain_cert(SSL_CTX *ctx, X509 *x509) { return (int)SSL_CTX_add1_chain_cert(ctx, x509); }
int CFanoutShims_sk_X509_num(const STACK_OF(X509) *stack) { return sk_X509_num(stack); }
X509 *CFanoutShims_sk_X509_value(const STACK_OF(X509) *stack, int index) { return sk_X509_value(stack, index); }
void CFanoutShims_sk_X509_pop_free(STACK_OF(X509) *stack) { sk_X509_pop_free(stack, X509_free); }
int CFanoutShims_ERR_GET_REASON(unsigned long error) { return ERR_GET_REASON(error); }
int CFanoutShims_set_current_thread_name(const char *name) { return pthread_setname_np(pthread_self(), name); }
#if defined(__GLIBC__)
int CFanoutShims_malloc_trim(size_t pad) { return malloc_trim(pad); }
#else
int CFanoutShims_malloc_trim(size_t pad) { (void)pad; return 0; }
#endif

/* OpenSSL initialised, before main, without its exit-time cleanup (OPENSSL_INIT_NO_ATEXIT). By default OpenSSL frees
 * its global state in an atexit handler; a loop thread still finishing (a Redis client's or an engine's, shut down
 * without being waited for, or whose thread-local destructors run after shutdown() returned) then uses or frees
 * that state again, and a process that calls exit crashes (SIGSEGV or a double free in libcrypto). The memory is
 * the process's to give back when it ends. */
__attribute__((constructor)) static void CFanoutShims_init_openssl(void) {
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}
