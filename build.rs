//! Build step: Mozilla's root certificates as one PEM bundle, the form the AWS SDK's trust
//! store takes (see `aws::https_client`), written once here rather than at every cold start.

use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let bundle: String = webpki_root_certs::TLS_SERVER_ROOT_CERTS
        .iter()
        .map(|der| pem::encode(&pem::Pem::new("CERTIFICATE", der.to_vec())))
        .collect();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out_dir.join("mozilla-roots.pem"), bundle).expect("write the root bundle");
}
