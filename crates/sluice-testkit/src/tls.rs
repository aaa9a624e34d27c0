//! Certificates for TLS tests, generated fresh for each run (rcgen, ECDSA P-256): a CA, a
//! server certificate for `localhost` and `127.0.0.1` signed by it (PostgreSQL's), one for
//! [`NAMED_HOST`] only (MariaDB's, so a certificate valid for another name than the one
//! connected to can be tested), a client certificate for the user [`CLIENT_USER`], and a
//! second CA that signed nothing the servers present (the "wrong CA"). Keys are written with
//! mode 0600, as libpq requires of client keys.

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// The user name the client certificate is issued to (its common name), which PostgreSQL's
/// `cert` authentication maps to the database user of the same name.
pub const CLIENT_USER: &str = "certuser";

/// The only name in the certificate of [`TestPki::named_server_cert`].
pub const NAMED_HOST: &str = "db.sluice.test";

/// The environment variable naming the directory of a run's certificates.
pub const DIR_VAR: &str = "SLUICE_TEST_TLS_DIR";

/// A directory of test certificates and keys (PEM).
pub struct TestPki {
    dir: PathBuf,
}

impl TestPki {
    /// Generate everything into `dir` (which must exist).
    pub fn generate(dir: &Path) -> Result<TestPki> {
        let ca_key = KeyPair::generate()?;
        let ca_params = ca("sluice test CA")?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate()?;
        let mut server = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])?;
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = server.signed_by(&server_key, &issuer)?;

        let named_key = KeyPair::generate()?;
        let mut named = CertificateParams::new(vec![NAMED_HOST.into()])?;
        named
            .distinguished_name
            .push(DnType::CommonName, NAMED_HOST);
        named.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let named_cert = named.signed_by(&named_key, &issuer)?;

        let client_key = KeyPair::generate()?;
        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client
            .distinguished_name
            .push(DnType::CommonName, CLIENT_USER);
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &issuer)?;

        let other_key = KeyPair::generate()?;
        let other = ca("some other CA")?.self_signed(&other_key)?;

        let pki = TestPki {
            dir: dir.to_path_buf(),
        };
        pki.write("ca.crt", &ca_cert.pem())?;
        pki.write("other-ca.crt", &other.pem())?;
        pki.write("server.crt", &server_cert.pem())?;
        pki.write_key("server.key", &server_key.serialize_pem())?;
        pki.write("named-server.crt", &named_cert.pem())?;
        pki.write_key("named-server.key", &named_key.serialize_pem())?;
        pki.write("client.crt", &client_cert.pem())?;
        pki.write_key("client.key", &client_key.serialize_pem())?;
        Ok(pki)
    }

    /// The certificates of a run, from [`DIR_VAR`].
    ///
    /// # Panics
    /// When the variable is not set: a TLS test fails loudly without its servers.
    pub fn from_env() -> TestPki {
        let dir = std::env::var(DIR_VAR).unwrap_or_else(|_| {
            panic!(
                "{DIR_VAR} is not set, so there are no TLS test servers. Run ./scripts/test, or \
                 sluice-testkit run --pg-tls --mariadb-tls -- …"
            )
        });
        TestPki {
            dir: PathBuf::from(dir),
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA that signed the servers' and the client's certificates.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A CA that signed none of them.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.crt")
    }

    /// The servers' certificate (for `localhost` and `127.0.0.1`).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// The servers' private key.
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// A server certificate valid only for [`NAMED_HOST`] (MariaDB's).
    pub fn named_server_cert(&self) -> PathBuf {
        self.dir.join("named-server.crt")
    }

    /// Its private key.
    pub fn named_server_key(&self) -> PathBuf {
        self.dir.join("named-server.key")
    }

    /// The client certificate of [`CLIENT_USER`].
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.crt")
    }

    /// The client certificate's private key (mode 0600).
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    fn write(&self, name: &str, text: &str) -> Result<()> {
        let path = self.dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    }

    fn write_key(&self, name: &str, text: &str) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        f.write_all(text.as_bytes())?;
        Ok(())
    }
}

fn ca(name: &str) -> Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}
