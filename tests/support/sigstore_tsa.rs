//! A timestamp authority made in the test, as Sigstore's (timestamp.sigstore.dev) is: a root
//! and a time-stamping leaf (the critical id-kp-timeStamping key usage, RFC 3161 §2.3), whose
//! key signs real RFC 3161 responses (a TimeStampResp holding a CMS SignedData over a
//! TSTInfo) over a signature's bytes, with the leaf embedded.

use cms::cert::{CertificateChoices, IssuerAndSerialNumber};
use cms::content_info::{CmsVersion, ContentInfo};
use cms::signed_data::{
    CertificateSet, EncapsulatedContentInfo, SignedData, SignerIdentifier, SignerInfo, SignerInfos,
};
use der::asn1::{GeneralizedTime, Int, ObjectIdentifier, OctetString, SetOfVec};
use der::{Any, Decode, Encode, Tag};
use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SigningKey,
};
use sha2::{Digest, Sha256};
use shim_agent::signature::timestamp::{MessageImprint, PkiStatusInfo, TimeStampResp, TstInfo};
use x509_cert::Certificate;
use x509_cert::attr::Attribute;
use x509_cert::spki::AlgorithmIdentifierOwned;

const ID_SIGNED_DATA: &str = "1.2.840.113549.1.7.2";
const ID_CT_TST_INFO: &str = "1.2.840.113549.1.9.16.1.4";
const ID_CONTENT_TYPE: &str = "1.2.840.113549.1.9.3";
const ID_MESSAGE_DIGEST: &str = "1.2.840.113549.1.9.4";
const ID_SHA256: &str = "2.16.840.1.101.3.4.2.1";
const ECDSA_SHA256: &str = "1.2.840.10045.4.3.2";

fn oid(s: &str) -> ObjectIdentifier {
    ObjectIdentifier::new_unwrap(s)
}

fn alg(s: &str) -> AlgorithmIdentifierOwned {
    AlgorithmIdentifierOwned {
        oid: oid(s),
        parameters: None,
    }
}

fn time(t: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t).expect("a time")
}

/// RFC 3339 of Unix seconds, as a trusted root writes its `validFor`.
pub fn rfc3339(t: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(t)
        .expect("a time")
        .to_string()
}

/// A timestamp authority: its root and leaf, and the period the trusted root trusts it for.
pub struct Tsa {
    pub root_der: Vec<u8>,
    pub leaf_der: Vec<u8>,
    leaf_key: KeyPair,
    /// (start, end) in Unix seconds: 2020 to 2030 unless changed.
    pub valid_for: (i64, i64),
}

impl Tsa {
    pub fn new(name: &str) -> Tsa {
        let root_key = KeyPair::generate().expect("key");
        let mut root = CertificateParams::new(Vec::<String>::new()).expect("params");
        root.distinguished_name
            .push(DnType::CommonName, format!("{name} root"));
        root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        root.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        root.not_before = time(1_577_836_800);
        root.not_after = time(2_208_988_800);
        let root_der = root.self_signed(&root_key).expect("root").der().to_vec();
        let leaf_key = KeyPair::generate().expect("key");
        let mut leaf = CertificateParams::new(Vec::<String>::new()).expect("params");
        leaf.distinguished_name
            .push(DnType::CommonName, format!("{name} leaf"));
        leaf.use_authority_key_identifier_extension = true;
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.not_before = time(1_577_836_800);
        leaf.not_after = time(2_208_988_800);
        // the extended key usage, critical, id-kp-timeStamping only (RFC 3161 §2.3)
        let mut eku = CustomExtension::from_oid_content(
            &[2, 5, 29, 37],
            vec![
                0x30, 0x0a, 0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x08,
            ],
        );
        eku.set_criticality(true);
        leaf.custom_extensions = vec![eku];
        let issuer = Issuer::from_params(&root, &root_key);
        let leaf_der = leaf
            .signed_by(&leaf_key, &issuer)
            .expect("leaf")
            .der()
            .to_vec();
        Tsa {
            root_der,
            leaf_der,
            leaf_key,
            valid_for: (1_577_836_800, 1_893_456_000),
        }
    }

    /// The chain a trusted root lists: the leaf first, the root last.
    pub fn chain(&self) -> Vec<Vec<u8>> {
        vec![self.leaf_der.clone(), self.root_der.clone()]
    }

    /// A granted RFC 3161 response (DER) stamping `sig` at `at`.
    pub fn stamp(&self, sig: &[u8], at: i64) -> Vec<u8> {
        let tst = TstInfo {
            version: 1,
            policy: oid("1.3.6.1.4.1.57264.2"),
            message_imprint: MessageImprint {
                hash_algorithm: alg(ID_SHA256),
                hashed_message: OctetString::new(Sha256::digest(sig).to_vec()).expect("octets"),
            },
            serial_number: Int::new(&[0x42]).expect("int"),
            gen_time: GeneralizedTime::from_unix_duration(std::time::Duration::from_secs(
                u64::try_from(at).expect("after 1970"),
            ))
            .expect("a time"),
            accuracy: None,
            ordering: false,
            nonce: None,
            tsa: None,
            extensions: None,
        };
        let tst_der = tst.to_der().expect("encode");
        let attr = |o: &str, v: Any| Attribute {
            oid: oid(o),
            values: SetOfVec::try_from(vec![v]).expect("set"),
        };
        let attrs = SetOfVec::try_from(vec![
            attr(
                ID_CONTENT_TYPE,
                Any::encode_from(&oid(ID_CT_TST_INFO)).expect("any"),
            ),
            attr(
                ID_MESSAGE_DIGEST,
                Any::new(Tag::OctetString, Sha256::digest(&tst_der).to_vec()).expect("any"),
            ),
        ])
        .expect("set");
        let signature = self
            .leaf_key
            .sign(&attrs.to_der().expect("encode"))
            .expect("sign");
        let leaf = Certificate::from_der(&self.leaf_der).expect("leaf");
        let signer = SignerInfo {
            version: CmsVersion::V1,
            sid: SignerIdentifier::IssuerAndSerialNumber(IssuerAndSerialNumber {
                issuer: leaf.tbs_certificate.issuer.clone(),
                serial_number: leaf.tbs_certificate.serial_number.clone(),
            }),
            digest_alg: alg(ID_SHA256),
            signed_attrs: Some(attrs),
            signature_algorithm: alg(ECDSA_SHA256),
            signature: OctetString::new(signature).expect("octets"),
            unsigned_attrs: None,
        };
        let sd = SignedData {
            version: CmsVersion::V3,
            digest_algorithms: SetOfVec::try_from(vec![alg(ID_SHA256)]).expect("set"),
            encap_content_info: EncapsulatedContentInfo {
                econtent_type: oid(ID_CT_TST_INFO),
                econtent: Some(Any::new(Tag::OctetString, tst_der).expect("any")),
            },
            certificates: Some(CertificateSet(
                SetOfVec::try_from(vec![CertificateChoices::Certificate(leaf)]).expect("set"),
            )),
            crls: None,
            signer_infos: SignerInfos(SetOfVec::try_from(vec![signer]).expect("set")),
        };
        TimeStampResp {
            status: PkiStatusInfo {
                status: 0,
                status_string: None,
                fail_info: None,
            },
            time_stamp_token: Some(ContentInfo {
                content_type: oid(ID_SIGNED_DATA),
                content: Any::encode_from(&sd).expect("any"),
            }),
        }
        .to_der()
        .expect("encode")
    }
}
