//! Counters, per-topic accounting and discard reports: the one place every role records what
//! happened to messages, and the only source the status server reads.
//!
//! Hot-path calls (`inc`, `received`, `delivered`, `queue_add`, a known `topic_id`) are atomics
//! only: no allocation and no global mutex. Discard reports (§10.2 of the reference) take a
//! mutex, because discards are the rare path.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Index into the topic table. `NO_TOPIC` (0) stands for "" (no parsable topic).
pub type TopicId = u32;

/// The topic id of input that has no parsable topic (malformed, unsupported, unclean).
pub const NO_TOPIC: TopicId = 0;

/// How many entries each "recent ..." list of a discard report keeps.
pub const LRU_CAPACITY: usize = 25;

/// Topic slots are allocated in segments of this many, so a topic table sized for
/// `max_topics` costs memory only for the topics that exist.
const SEGMENT: usize = 64;

/// Why a message was discarded. Every discard is counted under exactly one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiscardReason {
    Malformed,
    UnsupportedApiKey,
    UnsupportedVersion,
    UncleanDisconnect,
    NoMemory,
    BadTopic,
    TooLong,
    NoAvailablePartitions,
    RateLimit,
    AutocreateFailed,
    KafkaError,
    AttemptLimit,
    Shutdown,
}

impl DiscardReason {
    /// Every reason, in a stable order (the order of `/metrics` output).
    pub const ALL: [DiscardReason; 13] = [
        DiscardReason::Malformed,
        DiscardReason::UnsupportedApiKey,
        DiscardReason::UnsupportedVersion,
        DiscardReason::UncleanDisconnect,
        DiscardReason::NoMemory,
        DiscardReason::BadTopic,
        DiscardReason::TooLong,
        DiscardReason::NoAvailablePartitions,
        DiscardReason::RateLimit,
        DiscardReason::AutocreateFailed,
        DiscardReason::KafkaError,
        DiscardReason::AttemptLimit,
        DiscardReason::Shutdown,
    ];

    /// The snake_case name used as the `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscardReason::Malformed => "malformed",
            DiscardReason::UnsupportedApiKey => "unsupported_api_key",
            DiscardReason::UnsupportedVersion => "unsupported_version",
            DiscardReason::UncleanDisconnect => "unclean_disconnect",
            DiscardReason::NoMemory => "no_memory",
            DiscardReason::BadTopic => "bad_topic",
            DiscardReason::TooLong => "too_long",
            DiscardReason::NoAvailablePartitions => "no_available_partitions",
            DiscardReason::RateLimit => "rate_limit",
            DiscardReason::AutocreateFailed => "autocreate_failed",
            DiscardReason::KafkaError => "kafka_error",
            DiscardReason::AttemptLimit => "attempt_limit",
            DiscardReason::Shutdown => "shutdown",
        }
    }

    /// Position in `ALL`, used to index per-topic counter arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Generates `Counter` and its name table from one list, so the two cannot disagree.
macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Every named counter of the reference's Appendix A (served by `/counters`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Counter {
            $($name),*
        }

        impl Counter {
            /// Every counter, in catalogue order (the order `/counters` prints them).
            pub const ALL: &'static [Counter] = &[$(Counter::$name),*];
            /// How many counters there are.
            pub const COUNT: usize = Counter::ALL.len();

            /// The counter's name as monitoring scripts know it.
            pub fn name(self) -> &'static str {
                match self {
                    $(Counter::$name => stringify!($name)),*
                }
            }
        }
    };
}

counters! {
    // Messages.
    MsgCreate, MsgDestroy, MsgUnprocessedDestroy,
    // Input parsing.
    InputAgentProcessAnyPartitionMsg, InputAgentProcessPartitionKeyMsg,
    InputAgentDiscardMsgMalformed, InputAgentDiscardMsgNoMem,
    InputAgentDiscardMsgUnsupportedApiKey,
    InputAgentDiscardAnyPartitionMsgUnsupportedApiVersion,
    InputAgentDiscardPartitionKeyMsgUnsupportedApiVersion, UnixDgInputAgentForwardMsg,
    // Stream inputs.
    NewTcpClient, NewUnixClient,
    TcpInputCleanDisconnect, TcpInputUncleanDisconnect, TcpInputForwardMsg,
    TcpInputInvalidSizeField, TcpInputMsgBodyTooLarge, TcpInputSocketError,
    TcpInputSocketGotData, TcpInputSocketRead,
    UnixStreamInputCleanDisconnect, UnixStreamInputUncleanDisconnect, UnixStreamInputForwardMsg,
    UnixStreamInputInvalidSizeField, UnixStreamInputMsgBodyTooLarge, UnixStreamInputSocketError,
    UnixStreamInputSocketGotData, UnixStreamInputSocketRead,
    StreamClientWorkerStdException, StreamClientWorkerUnknownException,
    // Router.
    BatchExpiryDetected, SetBatchExpiry, PerTopicBatchAnyPartition, RouteMsgBatchList,
    RouteSingleMsg, RouteSingleAnyPartitionMsg, RouteSinglePartitionKeyMsg,
    RouterThreadGetMsgList, RouterThreadStartPause, RouterThreadFinishPause,
    DiscardBadTopicMsgOnRoute, DiscardBadTopicOnReroute, DiscardDeletedTopicMsg,
    DiscardDueToRateLimit, DiscardLongMsg, DiscardNoAvailablePartition,
    DiscardNoAvailablePartitionOnReroute, DiscardNoLongerAvailableTopicMsg,
    DiscardOnTopicAutocreateFail, PossibleDuplicateMsg, TopicHasNoAvailablePartitions,
    ConnectFailOnTopicAutocreate, ConnectSuccessOnTopicAutocreate, ConnectFailOnTryGetMetadata,
    ConnectSuccessOnTryGetMetadata, GetMetadataFail, GetMetadataSuccess, StartRefreshMetadata,
    FinishRefreshMetadata, RefreshMetadataSuccess, MetadataChangedOnRefresh,
    MetadataUnchangedOnRefresh, MetadataUpdated,
    // Metadata fetch and parse.
    StartSendMetadataRequest, SendMetadataRequestSuccess, SendMetadataRequestFail,
    SendMetadataRequestLostTcpConnection, SendMetadataRequestUnexpectedEnd,
    MetadataResponseReadSuccess, MetadataResponseReadTimeout,
    MetadataResponseReadLostTcpConnection, ShortMetadataResponse, BadMetadataResponse,
    BadMetadataResponseSize, BadKafkaResponseSize, MetadataHasEmptyBrokerList,
    MetadataHasEmptyTopicList, MetadataDuplicateBrokerId, MetadataDuplicatePartition,
    MetadataDuplicateTopic, MetadataPartitionHasUnknownBroker, MetadataSanityCheckSuccess,
    MetadataSanityCheckFail, MetadataResponseBadBrokerHostLen, MetadataResponseBadBrokerPort,
    MetadataResponseBadTopicNameLen,
    MetadataResponseIncomplete1, MetadataResponseIncomplete2, MetadataResponseIncomplete3,
    MetadataResponseIncomplete4, MetadataResponseIncomplete5, MetadataResponseIncomplete6,
    MetadataResponseIncomplete7, MetadataResponseIncomplete8, MetadataResponseIncomplete9,
    MetadataResponseIncomplete10,
    MetadataResponseInvalidLeaderNodeId,
    MetadataResponseNegativeBrokerCount, MetadataResponseNegativeBrokerNodeId,
    MetadataResponseNegativeCaughtUpReplicaNodeId,
    MetadataResponseNegativePartitionCaughtUpReplicaCount,
    MetadataResponseNegativePartitionCount, MetadataResponseNegativePartitionId,
    MetadataResponseNegativePartitionReplicaCount, MetadataResponseNegativeReplicaNodeId,
    MetadataResponseNegativeTopicCount,
    TopicAutocreateSuccess, TopicAutocreateGotErrorResponse, TopicAutocreateNoTopicInResponse,
    TopicAutocreateUnexpectedTopicInResponse,
    // Dispatcher and connectors.
    StartKafkaDispatcher, StartDispatcherFastShutdown, StartDispatcherSlowShutdown,
    StartDispatcherJoinAll, FinishDispatcherJoinAll, AllDispatcherThreadsFinished,
    SkipOutOfServiceBroker, DispatchOneMsg, DispatchOneBatch, PauseStarted,
    ConnectorStartRun, ConnectorFinishRun, ConnectorStartConnect, ConnectorConnectSuccess,
    ConnectorConnectFail, ConnectorSocketError, ConnectorSocketTimeout,
    ConnectorSocketBrokerClose, ConnectorSocketReadSuccess, ConnectorDoSocketRead,
    ConnectorCheckInputQueue, ConnectorCleanupAfterJoin, ConnectorStartFastShutdown,
    ConnectorStartSlowShutdown, ConnectorStartWaitShutdownAck, ConnectorFinishWaitShutdownAck,
    ConnectorTruncateLongTimeout,
    SendProduceRequestOk, AckNotRequired, BadProduceResponse, BadProduceResponseSize,
    CorrelationIdMismatch,
    ProduceResponseUnexpectedTopic, ProduceResponseUnexpectedPartition,
    ProduceResponseShortTopicList, ProduceResponseShortPartitionList,
    ProduceResponseBadTopicCount, ProduceResponseBadTopicNameLength,
    ProduceResponseBadPartitionCount,
    ProduceResponseTruncated1, ProduceResponseTruncated2, ProduceResponseTruncated3,
    ProduceResponseTruncated4, ProduceResponseTruncated5,
    ConnectorGotSuccessfulAck, ConnectorGotResendAck, ConnectorGotDiscardAck,
    ConnectorGotPauseAck, ConnectorGotDiscardAndPauseAck, ConnectorGotOkProduceResponse,
    ConnectorQueueImmediateResendMsgSet, ConnectorQueuePauseAndResendMsgSet,
    ConnectorQueueNoAckMsgs,
    DiscardOnFailedDeliveryAttemptLimit, AckOk,
    // One per error code of the reference's §7.3, in code order (-1, 1..=43).
    AckErrorUnknown, AckErrorOffsetOutOfRange, AckErrorCorruptMessage,
    AckErrorUnknownTopicOrPartition, AckErrorInvalidFetchSize, AckErrorLeaderNotAvailable,
    AckErrorNotLeaderForPartition, AckErrorRequestTimedOut, AckErrorBrokerNotAvailable,
    AckErrorReplicaNotAvailable, AckErrorMessageTooLarge, AckErrorStaleControllerEpoch,
    AckErrorOffsetMetadataTooLarge, AckErrorNetworkException, AckErrorGroupLoadInProgress,
    AckErrorGroupCoordinatorNotAvailable, AckErrorNotCoordinatorForGroup,
    AckErrorInvalidTopicException, AckErrorRecordListTooLarge, AckErrorNotEnoughReplicas,
    AckErrorNotEnoughReplicasAfterAppend, AckErrorInvalidRequiredAcks,
    AckErrorIllegalGeneration, AckErrorInconsistentGroupProtocol, AckErrorInvalidGroupId,
    AckErrorUnknownMemberId, AckErrorInvalidSessionTimeout, AckErrorRebalanceInProgress,
    AckErrorInvalidCommitOffsetSize, AckErrorTopicAuthorizationFailed,
    AckErrorGroupAuthorizationFailed, AckErrorClusterAuthorizationFailed,
    AckErrorInvalidTimestamp, AckErrorUnsupportedSaslMechanism, AckErrorIllegalSaslState,
    AckErrorUnsupportedVersion, AckErrorTopicAlreadyExists, AckErrorInvalidPartitions,
    AckErrorInvalidReplicationFactor, AckErrorInvalidReplicaAssignment, AckErrorInvalidConfig,
    AckErrorNotController, AckErrorInvalidRequest, AckErrorUnsupportedForMessageFormat,
    AckErrorUndocumented,
    // Broker queue and request building.
    BrokerMsgQueueNotify, BrokerMsgQueueSkipNotify, CombinedTopicsBatchAnyPartition,
    CombinedTopicsBatchPartitionKey, NoBatchAnyPartition, NoBatchPartitionKey,
    PerTopicBatchPartitionKey, SerializeMsg, SerializeMsgSet, SerializeTopicGroup,
    SerializeProduceRequest, MsgSetCompressionYes, MsgSetCompressionNo, MsgSetNotCompressible,
    MsgSetCompressionError,
    // dory: zstd configured, broker below Produce v7, sent uncompressed.
    MsgSetZstdUnsupportedByBroker,
    // Codecs.
    ZlibCompressSuccess, ZlibBufError, ZlibDataError, ZlibDecompressOutOfSpace,
    ZlibNeedDictError, ZlibNotAtEndAfterCompress, ZlibOverflowComputingCompressBufSize,
    ZlibStreamError, ZlibUnknownError, ZlibVersionError,
    SnappyCompressSuccess, SnappyBufferTooSmallError, SnappyInvalidInputError, SnappyUnknownError,
    Lz4CompressSuccess, Lz4Error,
    // Bugs: any non-zero value is a bug.
    BugAllTopicsEmpty, BugMsgListMultipleTopics, BugMsgSetEmpty, BugMultiPartitionGroupEmpty,
    BugProduceRequestEmpty, BugDispatchMsgOutOfRangeIndex, BugDispatchBatchOutOfRangeIndex,
    BugGetAckWaitQueueOutOfRangeIndex,
    // Web, process and logging.
    MongooseHttpRequest, MongooseGetServerInfoRequest, MongooseGetCountersRequest,
    MongooseGetDiscardsRequest, MongooseGetMetadataFetchTimeRequest,
    MongooseGetQueueStatsRequest, MongooseEventLog, MongooseStdException,
    MongooseUnknownException, MongooseUrlDecodeError, NoDiscardQuery, GotShutdownRequest,
    GotLogfileReopenRequest, LogPrefixWriteFailed, LogToFileFailedShortCount,
    LogToFileFailedSysError, LogToStdoutStderrFailedShortCount, LogToStdoutStderrFailedSysError,
}

impl Counter {
    /// The `AckError<Name>` counter for a produce-response error code (`AckOk` for 0).
    pub fn for_ack_error(code: i16) -> Counter {
        const BY_CODE: [Counter; 43] = [
            Counter::AckErrorOffsetOutOfRange,
            Counter::AckErrorCorruptMessage,
            Counter::AckErrorUnknownTopicOrPartition,
            Counter::AckErrorInvalidFetchSize,
            Counter::AckErrorLeaderNotAvailable,
            Counter::AckErrorNotLeaderForPartition,
            Counter::AckErrorRequestTimedOut,
            Counter::AckErrorBrokerNotAvailable,
            Counter::AckErrorReplicaNotAvailable,
            Counter::AckErrorMessageTooLarge,
            Counter::AckErrorStaleControllerEpoch,
            Counter::AckErrorOffsetMetadataTooLarge,
            Counter::AckErrorNetworkException,
            Counter::AckErrorGroupLoadInProgress,
            Counter::AckErrorGroupCoordinatorNotAvailable,
            Counter::AckErrorNotCoordinatorForGroup,
            Counter::AckErrorInvalidTopicException,
            Counter::AckErrorRecordListTooLarge,
            Counter::AckErrorNotEnoughReplicas,
            Counter::AckErrorNotEnoughReplicasAfterAppend,
            Counter::AckErrorInvalidRequiredAcks,
            Counter::AckErrorIllegalGeneration,
            Counter::AckErrorInconsistentGroupProtocol,
            Counter::AckErrorInvalidGroupId,
            Counter::AckErrorUnknownMemberId,
            Counter::AckErrorInvalidSessionTimeout,
            Counter::AckErrorRebalanceInProgress,
            Counter::AckErrorInvalidCommitOffsetSize,
            Counter::AckErrorTopicAuthorizationFailed,
            Counter::AckErrorGroupAuthorizationFailed,
            Counter::AckErrorClusterAuthorizationFailed,
            Counter::AckErrorInvalidTimestamp,
            Counter::AckErrorUnsupportedSaslMechanism,
            Counter::AckErrorIllegalSaslState,
            Counter::AckErrorUnsupportedVersion,
            Counter::AckErrorTopicAlreadyExists,
            Counter::AckErrorInvalidPartitions,
            Counter::AckErrorInvalidReplicationFactor,
            Counter::AckErrorInvalidReplicaAssignment,
            Counter::AckErrorInvalidConfig,
            Counter::AckErrorNotController,
            Counter::AckErrorInvalidRequest,
            Counter::AckErrorUnsupportedForMessageFormat,
        ];
        match code {
            0 => Counter::AckOk,
            -1 => Counter::AckErrorUnknown,
            c => usize::try_from(c)
                .ok()
                .and_then(|c| BY_CODE.get(c - 1))
                .copied()
                .unwrap_or(Counter::AckErrorUndocumented),
        }
    }
}

/// Life-cycle states whose per-topic counts `/queues` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueState {
    New,
    Batch,
    SendWait,
    AckWait,
}

/// Start-up progress, as `/health` reports it. Only ever moves forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Health {
    Starting,
    InputsOpen,
    Ready,
}

/// Settings the metrics need; built from the validated config.
#[derive(Clone, Debug)]
pub struct MetricsConfig {
    /// Length of one discard-report period.
    pub discard_report_interval: Duration,
    /// Raw prefixes kept in discard reports are truncated to this many bytes.
    pub bad_msg_prefix_size: usize,
    /// Most distinct topics tracked (besides ""); `topic_id` returns `None` beyond it.
    pub max_topics: usize,
    /// Version string served in every status response.
    pub version: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            discard_report_interval: Duration::from_secs(600),
            bad_msg_prefix_size: 256,
            max_topics: 10_000,
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Count and client-timestamp range of the messages one report holds for one topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicRange {
    pub count: u64,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
}

impl TopicRange {
    fn add(&mut self, n: u64, min_ts: i64, max_ts: i64) {
        self.count += n;
        self.min_timestamp = self.min_timestamp.min(min_ts);
        self.max_timestamp = self.max_timestamp.max(max_ts);
    }
}

/// Message counts per queue state of one topic (gauges: they go up and down).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub new: i64,
    pub batch: i64,
    pub send_wait: i64,
    pub ack_wait: i64,
}

/// One topic's accounting at one moment; see `Metrics::snapshot_topics`.
#[derive(Clone, Debug)]
pub struct TopicSnapshot {
    pub id: TopicId,
    pub name: Arc<[u8]>,
    pub received: u64,
    pub delivered: u64,
    /// Indexed by `DiscardReason::index`.
    pub discarded: [u64; 13],
    pub possible_duplicates: u64,
    /// `received - delivered - sum(discarded)`; never negative when callers count
    /// `received` before the outcome (see `snapshot_topics`).
    pub in_flight: i64,
    pub queued: QueueCounts,
}

impl TopicSnapshot {
    /// Discards of this topic under one reason.
    pub fn discarded(&self, reason: DiscardReason) -> u64 {
        self.discarded[reason.index()]
    }

    /// Discards of this topic under all reasons.
    pub fn discarded_total(&self) -> u64 {
        self.discarded.iter().sum()
    }
}

/// One reporting period of discards (§10.2), copied out for rendering. Topic lists are sorted
/// by name; "recent" lists are most recent first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscardReport {
    pub id: u64,
    /// Period start, seconds since the epoch.
    pub start_secs: u64,
    pub malformed_count: u64,
    pub unix_stream_unclean_count: u64,
    pub tcp_unclean_count: u64,
    pub unsupported_api_key_count: u64,
    pub unsupported_version_count: u64,
    pub bad_topic_count: u64,
    pub recent_malformed: Vec<Box<[u8]>>,
    pub recent_unix_stream_unclean: Vec<Box<[u8]>>,
    pub recent_tcp_unclean: Vec<Box<[u8]>>,
    /// (version, count), sorted by version.
    pub unsupported_versions: Vec<(i16, u64)>,
    pub recent_bad_topics: Vec<Box<[u8]>>,
    pub recent_too_long: Vec<Box<[u8]>>,
    pub rate_limit: Vec<(Arc<[u8]>, u64)>,
    pub discard_topics: Vec<(Arc<[u8]>, TopicRange)>,
    pub possible_duplicate_topics: Vec<(Arc<[u8]>, TopicRange)>,
}

/// The current (unfinished) report and the latest finished one, if a period has completed.
#[derive(Clone, Debug)]
pub struct DiscardReports {
    pub interval: Duration,
    pub current: DiscardReport,
    pub finished: Option<DiscardReport>,
}

/// All counters and accounting of the daemon. Created once, shared as `&'static`.
pub struct Metrics {
    counters: Box<[AtomicU64]>,
    topics: TopicTable,
    reports: Mutex<Periods>,
    bad_msg_prefix_size: usize,
    interval_secs: u64,
    version: String,
    pid: u32,
    start_secs: u64,
    last_discard_query_secs: AtomicU64,
    metadata_updated_ms: AtomicU64,
    metadata_modified_ms: AtomicU64,
    health: AtomicU8,
    pool_capacity: AtomicU64,
    pool_used: AtomicU64,
    /// The live pool, once attached: its gauges are then read at scrape time.
    live_pool: std::sync::OnceLock<&'static crate::pool::Pool>,
    /// The discard log, when configured.
    discard_log: std::sync::OnceLock<crate::report::discard_log::DiscardLogSender>,
    /// Message debug logging (always present; refuses requests when not configured).
    msg_debug: std::sync::OnceLock<Arc<crate::report::msg_debug::MsgDebug>>,
}

impl Metrics {
    pub fn new(config: MetricsConfig) -> Self {
        let start_secs = now_secs();
        let interval_secs = config.discard_report_interval.as_secs().max(1);
        Metrics {
            counters: (0..Counter::COUNT).map(|_| AtomicU64::new(0)).collect(),
            topics: TopicTable::new(config.max_topics),
            reports: Mutex::new(Periods::new(start_secs, interval_secs)),
            bad_msg_prefix_size: config.bad_msg_prefix_size,
            interval_secs,
            version: config.version,
            pid: std::process::id(),
            start_secs,
            last_discard_query_secs: AtomicU64::new(start_secs),
            metadata_updated_ms: AtomicU64::new(0),
            metadata_modified_ms: AtomicU64::new(0),
            health: AtomicU8::new(Health::Starting as u8),
            pool_capacity: AtomicU64::new(0),
            pool_used: AtomicU64::new(0),
            live_pool: std::sync::OnceLock::new(),
            discard_log: std::sync::OnceLock::new(),
            msg_debug: std::sync::OnceLock::new(),
        }
    }

    // ----- named counters -----

    pub fn inc(&self, c: Counter) {
        self.add(c, 1);
    }

    pub fn add(&self, c: Counter, n: u64) {
        self.counters[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self, c: Counter) -> u64 {
        self.counters[c as usize].load(Ordering::Relaxed)
    }

    // ----- topics -----

    /// Interns a topic name. `None` once `max_topics` distinct topics exist: the caller then
    /// accounts the message under `NO_TOPIC`. The empty name is always `NO_TOPIC`.
    pub fn topic_id(&self, name: &[u8]) -> Option<TopicId> {
        self.topics.intern(name)
    }

    /// The name of an interned topic ("" for `NO_TOPIC` or an id never handed out).
    pub fn topic_name(&self, id: TopicId) -> Arc<[u8]> {
        self.topics.stats(id).name()
    }

    // ----- per-message accounting (hot path) -----
    //
    // Orderings: `received` is Relaxed; every outcome (`delivered`, `discarded`) is a Release
    // increment, and `snapshot_topics` reads outcomes with Acquire before it reads `received`.
    // Each message's `received` increment happens before its outcome (same thread, or handed
    // over through a channel), so a snapshot that sees an outcome also sees its receipt.

    /// `n` messages of topic `t` entered the daemon. Must be called before their outcome.
    pub fn received(&self, t: TopicId, n: u64) {
        self.topics
            .stats(t)
            .received
            .fetch_add(n, Ordering::Relaxed);
    }

    /// `n` messages of topic `t` were acknowledged by Kafka.
    pub fn delivered(&self, t: TopicId, n: u64) {
        self.topics
            .stats(t)
            .delivered
            .fetch_add(n, Ordering::Release);
    }

    /// `n` messages of topic `t` were discarded. Goes to the current report's per-topic map
    /// (count, min/max client timestamp), except `BadTopic`, which goes to the bad-topic count
    /// and the recent-bad-topic list; `RateLimit` also goes to the rate-limit counts. Does not
    /// touch named counters (`DiscardLongMsg` ...): the call site knows which one applies.
    pub fn discarded(&self, t: TopicId, reason: DiscardReason, n: u64, min_ts: i64, max_ts: i64) {
        self.count_discard(t, reason, n);
        let name = (reason == DiscardReason::BadTopic).then(|| self.topic_name(t));
        let mut periods = self.periods();
        let r = &mut periods.current;
        match name {
            Some(name) => {
                r.bad_topic += n;
                r.recent_bad_topics.push(&name);
            }
            None => {
                add_range(&mut r.discards, t, n, min_ts, max_ts);
                if reason == DiscardReason::RateLimit {
                    *r.rate_limit.entry(t).or_insert(0) += n;
                }
            }
        }
    }

    /// One input message without a parsed topic was discarded: counted under `NO_TOPIC` (the
    /// caller has already called `received(NO_TOPIC, 1)`) and in the report. `Malformed` keeps
    /// the prefix in the recent-malformed list; `UnsupportedApiKey` and `UnsupportedVersion`
    /// only count (use `unsupported_version` to fill the per-version list); `UncleanDisconnect`
    /// is taken as a UNIX stream one (use `unclean_disconnect` to say which). Any other reason
    /// goes to the per-topic map under "" with the current time as timestamp.
    pub fn input_discard(&self, reason: DiscardReason, raw_prefix: &[u8]) {
        if reason == DiscardReason::UncleanDisconnect {
            self.unclean_disconnect(false, raw_prefix);
            return;
        }
        self.count_discard(NO_TOPIC, reason, 1);
        let prefix = self.prefix(raw_prefix);
        let mut periods = self.periods();
        let r = &mut periods.current;
        match reason {
            DiscardReason::Malformed => {
                r.malformed += 1;
                r.recent_malformed.push(prefix);
            }
            DiscardReason::UnsupportedApiKey => r.unsupported_api_key += 1,
            DiscardReason::UnsupportedVersion => r.unsupported_version += 1,
            _ => {
                let now = i64::try_from(now_ms()).unwrap_or(i64::MAX);
                add_range(&mut r.discards, NO_TOPIC, 1, now, now);
            }
        }
    }

    /// One input message with an unsupported API version was discarded (see `input_discard`).
    /// The report keeps no prefixes of these; `raw_prefix` is for the discard log.
    pub fn unsupported_version(&self, version: i16, raw_prefix: &[u8]) {
        let _ = raw_prefix;
        self.count_discard(NO_TOPIC, DiscardReason::UnsupportedVersion, 1);
        let mut periods = self.periods();
        let r = &mut periods.current;
        r.unsupported_version += 1;
        *r.unsupported_versions.entry(version).or_insert(0) += 1;
    }

    /// A stream client left in the middle of a message: one discard under `NO_TOPIC` (the
    /// caller has already called `received(NO_TOPIC, 1)`), counted per transport with the
    /// partial bytes in the recent list.
    pub fn unclean_disconnect(&self, tcp: bool, partial: &[u8]) {
        self.count_discard(NO_TOPIC, DiscardReason::UncleanDisconnect, 1);
        let prefix = self.prefix(partial);
        let mut periods = self.periods();
        let r = &mut periods.current;
        if tcp {
            r.tcp_unclean += 1;
            r.recent_tcp_unclean.push(prefix);
        } else {
            r.unix_stream_unclean += 1;
            r.recent_unix_stream_unclean.push(prefix);
        }
    }

    /// Records a "topic value" sample of a message too long for Kafka. The discard itself is
    /// counted by `discarded(t, TooLong, ..)`.
    pub fn too_long_sample(&self, topic: &[u8], value: &[u8]) {
        let limit = self.bad_msg_prefix_size;
        let mut sample = Vec::with_capacity(limit.min(topic.len() + 1 + value.len()));
        sample.extend_from_slice(topic);
        sample.push(b' ');
        sample.extend_from_slice(value);
        sample.truncate(limit);
        self.periods().current.recent_too_long.push(&sample);
    }

    /// `n` messages of topic `t` were sent but never acknowledged, and are being sent again.
    pub fn possible_duplicates(&self, t: TopicId, n: u64, min_ts: i64, max_ts: i64) {
        self.topics
            .stats(t)
            .possible_duplicates
            .fetch_add(n, Ordering::Relaxed);
        add_range(&mut self.periods().current.duplicates, t, n, min_ts, max_ts);
    }

    /// Moves `delta` messages of topic `t` into (positive) or out of (negative) a state.
    pub fn queue_add(&self, t: TopicId, state: QueueState, delta: i64) {
        self.topics.stats(t).queued[state as usize].fetch_add(delta, Ordering::Relaxed);
    }

    // ----- daemon state -----

    /// A metadata fetch succeeded; `modified` when it replaced the metadata.
    pub fn metadata_updated(&self, modified: bool) {
        let now = now_ms();
        self.metadata_updated_ms.store(now, Ordering::Relaxed);
        if modified {
            self.metadata_modified_ms.store(now, Ordering::Relaxed);
        }
    }

    /// (last updated, last modified), milliseconds since the epoch; 0 before the first fetch.
    pub fn metadata_times_ms(&self) -> (u64, u64) {
        (
            self.metadata_updated_ms.load(Ordering::Relaxed),
            self.metadata_modified_ms.load(Ordering::Relaxed),
        )
    }

    /// Records start-up progress. Health only moves forward, so roles may report in any order.
    pub fn set_health(&self, h: Health) {
        self.health.fetch_max(h as u8, Ordering::Relaxed);
    }

    /// Ready once inputs are open and the first metadata fetch succeeded (either reported as
    /// `Ready`, or `InputsOpen` plus a `metadata_updated`).
    pub fn health(&self) -> Health {
        match self.health.load(Ordering::Relaxed) {
            0 => Health::Starting,
            1 if self.metadata_updated_ms.load(Ordering::Relaxed) == 0 => Health::InputsOpen,
            _ => Health::Ready,
        }
    }

    /// Message pool gauges, in bytes.
    pub fn set_pool(&self, capacity: usize, used: usize) {
        self.pool_capacity.store(
            u64::try_from(capacity).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.pool_used
            .store(u64::try_from(used).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Writes discards to this log from now on.
    pub fn attach_discard_log(&self, log: crate::report::discard_log::DiscardLogSender) {
        let _ = self.discard_log.set(log);
    }

    pub fn discard_log(&self) -> Option<&crate::report::discard_log::DiscardLogSender> {
        self.discard_log.get()
    }

    /// Shares message debug logging with every role and the status server.
    pub fn attach_msg_debug(&self, d: Arc<crate::report::msg_debug::MsgDebug>) {
        let _ = self.msg_debug.set(d);
    }

    pub fn msg_debug(&self) -> Option<&crate::report::msg_debug::MsgDebug> {
        self.msg_debug.get().map(|d| &**d)
    }

    /// Reads the pool's gauges live from now on (instead of [`Metrics::set_pool`]).
    pub fn attach_pool(&self, pool: &'static crate::pool::Pool) {
        let _ = self.live_pool.set(pool);
    }

    /// (capacity, used) of the message pool, in bytes.
    pub fn pool(&self) -> (u64, u64) {
        if let Some(p) = self.live_pool.get() {
            return (p.capacity_bytes() as u64, p.used_bytes() as u64);
        }
        (
            self.pool_capacity.load(Ordering::Relaxed),
            self.pool_used.load(Ordering::Relaxed),
        )
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    /// Process start, seconds since the epoch.
    pub fn start_secs(&self) -> u64 {
        self.start_secs
    }

    /// Length of one discard-report period.
    pub fn discard_report_interval(&self) -> Duration {
        Duration::from_secs(self.interval_secs)
    }

    // ----- reading -----

    /// Every topic's accounting (including "" as `NO_TOPIC`), in id order.
    pub fn snapshot_topics(&self) -> Vec<TopicSnapshot> {
        let count = self.topics.len();
        let mut out = Vec::with_capacity(count);
        for id in 0..count {
            let Ok(id) = TopicId::try_from(id) else { break };
            let s = self.topics.stats(id);
            // Outcomes first (Acquire), `received` last: every message counts `received`
            // before its outcome, so the `received` read here covers every outcome read above
            // and `in_flight` is never negative. Reading `received` first would race with a
            // message that arrives and completes between the reads.
            let delivered = s.delivered.load(Ordering::Acquire);
            let mut discarded = [0u64; 13];
            for (d, a) in discarded.iter_mut().zip(s.discarded.iter()) {
                *d = a.load(Ordering::Acquire);
            }
            let received = s.received.load(Ordering::Acquire);
            let done = discarded
                .iter()
                .fold(delivered, |acc, d| acc.wrapping_add(*d));
            // Two's complement: a (buggy) surplus of outcomes shows as a negative count
            // instead of wrapping to a huge one.
            let in_flight = received.wrapping_sub(done) as i64;
            let q = |state: QueueState| s.queued[state as usize].load(Ordering::Relaxed);
            out.push(TopicSnapshot {
                id,
                name: s.name(),
                received,
                delivered,
                discarded,
                possible_duplicates: s.possible_duplicates.load(Ordering::Relaxed),
                in_flight,
                queued: QueueCounts {
                    new: q(QueueState::New),
                    batch: q(QueueState::Batch),
                    send_wait: q(QueueState::SendWait),
                    ack_wait: q(QueueState::AckWait),
                },
            });
        }
        out
    }

    /// Messages received but neither delivered nor discarded yet, over all topics.
    pub fn total_in_flight(&self) -> i64 {
        self.snapshot_topics().iter().map(|t| t.in_flight).sum()
    }

    /// Copies the discard reports out, first rolling the periods forward to `now_secs`.
    pub fn discard_reports(&self, now_secs: u64) -> DiscardReports {
        let mut periods = self.periods();
        periods.advance(now_secs);
        DiscardReports {
            interval: self.discard_report_interval(),
            current: periods.current.export(&self.topics),
            finished: periods.finished.as_ref().map(|r| r.export(&self.topics)),
        }
    }

    /// Remembers that a monitor read the discard reports.
    pub fn note_discard_query(&self, now_secs: u64) {
        self.last_discard_query_secs
            .fetch_max(now_secs, Ordering::Relaxed);
    }

    /// For the periodic check of §10.2: when no discard query arrived in the last interval,
    /// counts `NoDiscardQuery` and returns true (the caller logs the warning).
    pub fn check_discard_query(&self, now_secs: u64) -> bool {
        let last = self.last_discard_query_secs.load(Ordering::Relaxed);
        let overdue = now_secs.saturating_sub(last) > self.interval_secs;
        if overdue {
            self.inc(Counter::NoDiscardQuery);
        }
        overdue
    }

    // ----- helpers -----

    fn count_discard(&self, t: TopicId, reason: DiscardReason, n: u64) {
        self.topics.stats(t).discarded[reason.index()].fetch_add(n, Ordering::Release);
    }

    fn prefix<'a>(&self, raw: &'a [u8]) -> &'a [u8] {
        &raw[..raw.len().min(self.bad_msg_prefix_size)]
    }

    /// The reports, rolled forward to now. A panic while holding the lock leaves the reports
    /// consistent enough to keep counting, so poisoning is ignored.
    fn periods(&self) -> MutexGuard<'_, Periods> {
        let mut p = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
        p.advance(now_secs());
        p
    }
}

fn add_range(map: &mut HashMap<TopicId, TopicRange>, t: TopicId, n: u64, lo: i64, hi: i64) {
    map.entry(t)
        .or_insert(TopicRange {
            count: 0,
            min_timestamp: lo,
            max_timestamp: hi,
        })
        .add(n, lo, hi);
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(crate) fn now_secs() -> u64 {
    now_ms() / 1000
}

// ----- topic table -----

/// Per-topic atomics. Slots live in fixed segments that are never moved or freed, so the hot
/// path reaches them without a lock.
#[derive(Default)]
struct TopicStats {
    name: OnceLock<Arc<[u8]>>,
    received: AtomicU64,
    delivered: AtomicU64,
    discarded: [AtomicU64; 13],
    possible_duplicates: AtomicU64,
    queued: [AtomicI64; 4],
}

impl TopicStats {
    fn name(&self) -> Arc<[u8]> {
        self.name
            .get()
            .cloned()
            .unwrap_or_else(|| Arc::from(&b""[..]))
    }
}

struct TopicTable {
    by_name: RwLock<HashMap<Arc<[u8]>, TopicId>>,
    segments: Box<[OnceLock<Box<[TopicStats]>>]>,
    /// Ids handed out so far (including `NO_TOPIC`); published after the slot is set up.
    len: AtomicU32,
    max_topics: usize,
    /// Whether the table being full was logged (once: every refused message is counted).
    full_logged: AtomicBool,
}

impl TopicTable {
    fn new(max_topics: usize) -> Self {
        // Ids are u32 and id 0 is "", so at most u32::MAX - 1 real topics.
        let max_topics = max_topics.min(u32::MAX as usize - 1);
        let slots = max_topics + 1;
        let segments: Box<[OnceLock<Box<[TopicStats]>>]> = (0..slots.div_ceil(SEGMENT))
            .map(|_| OnceLock::new())
            .collect();
        let table = TopicTable {
            by_name: RwLock::new(HashMap::new()),
            segments,
            len: AtomicU32::new(1),
            max_topics,
            full_logged: AtomicBool::new(false),
        };
        // Segment 0 always exists, so `NO_TOPIC` and the fallback below are always valid.
        let no_topic = table.segment(0);
        let _ = no_topic[0].name.set(Arc::from(&b""[..]));
        table
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Acquire) as usize
    }

    fn segment(&self, index: usize) -> &[TopicStats] {
        self.segments[index].get_or_init(|| (0..SEGMENT).map(|_| TopicStats::default()).collect())
    }

    /// The slot of `id`. An id never handed out is a caller bug; it falls back to `NO_TOPIC`
    /// so that its messages are still counted consistently.
    fn stats(&self, id: TopicId) -> &TopicStats {
        let i = id as usize;
        let slot = self
            .segments
            .get(i / SEGMENT)
            .and_then(OnceLock::get)
            .map(|seg| &seg[i % SEGMENT]);
        match slot {
            Some(s) if s.name.get().is_some() => s,
            _ => &self.segment(0)[0],
        }
    }

    fn intern(&self, name: &[u8]) -> Option<TopicId> {
        if name.is_empty() {
            return Some(NO_TOPIC);
        }
        let read = self.by_name.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(&id) = read.get(name) {
            return Some(id);
        }
        drop(read);
        let mut write = self.by_name.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(&id) = write.get(name) {
            return Some(id);
        }
        let next = self.len.load(Ordering::Relaxed);
        if next as usize > self.max_topics {
            if !self.full_logged.swap(true, Ordering::Relaxed) {
                log::error!(
                    "topic table full: {} distinct topic names seen; messages for further \
                     new topics are discarded as bad_topic under topic \"\" (raise \
                     input.max_topics)",
                    self.max_topics
                );
            }
            return None;
        }
        let name: Arc<[u8]> = Arc::from(name);
        let i = next as usize;
        let _ = self.segment(i / SEGMENT)[i % SEGMENT]
            .name
            .set(Arc::clone(&name));
        write.insert(name, next);
        self.len.store(next + 1, Ordering::Release);
        Some(next)
    }

    fn sorted_by_name<V: Copy>(&self, map: &HashMap<TopicId, V>) -> Vec<(Arc<[u8]>, V)> {
        let mut v: Vec<(Arc<[u8]>, V)> = map
            .iter()
            .map(|(&t, &val)| (self.stats(t).name(), val))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

// ----- discard reports -----

/// Most-recent-first list of at most `LRU_CAPACITY` distinct entries.
#[derive(Debug, Default)]
struct Lru {
    items: VecDeque<Box<[u8]>>,
}

impl Lru {
    fn push(&mut self, item: &[u8]) {
        if let Some(pos) = self.items.iter().position(|x| **x == *item) {
            if let Some(existing) = self.items.remove(pos) {
                self.items.push_front(existing);
            }
            return;
        }
        if self.items.len() >= LRU_CAPACITY {
            self.items.pop_back();
        }
        self.items.push_front(item.into());
    }

    fn to_vec(&self) -> Vec<Box<[u8]>> {
        self.items.iter().cloned().collect()
    }
}

#[derive(Debug, Default)]
struct Report {
    id: u64,
    start_secs: u64,
    malformed: u64,
    unix_stream_unclean: u64,
    tcp_unclean: u64,
    unsupported_api_key: u64,
    unsupported_version: u64,
    bad_topic: u64,
    recent_malformed: Lru,
    recent_unix_stream_unclean: Lru,
    recent_tcp_unclean: Lru,
    unsupported_versions: BTreeMap<i16, u64>,
    recent_bad_topics: Lru,
    recent_too_long: Lru,
    rate_limit: HashMap<TopicId, u64>,
    discards: HashMap<TopicId, TopicRange>,
    duplicates: HashMap<TopicId, TopicRange>,
}

impl Report {
    fn empty(id: u64, start_secs: u64) -> Self {
        Report {
            id,
            start_secs,
            ..Report::default()
        }
    }

    fn export(&self, topics: &TopicTable) -> DiscardReport {
        DiscardReport {
            id: self.id,
            start_secs: self.start_secs,
            malformed_count: self.malformed,
            unix_stream_unclean_count: self.unix_stream_unclean,
            tcp_unclean_count: self.tcp_unclean,
            unsupported_api_key_count: self.unsupported_api_key,
            unsupported_version_count: self.unsupported_version,
            bad_topic_count: self.bad_topic,
            recent_malformed: self.recent_malformed.to_vec(),
            recent_unix_stream_unclean: self.recent_unix_stream_unclean.to_vec(),
            recent_tcp_unclean: self.recent_tcp_unclean.to_vec(),
            unsupported_versions: self
                .unsupported_versions
                .iter()
                .map(|(&v, &n)| (v, n))
                .collect(),
            recent_bad_topics: self.recent_bad_topics.to_vec(),
            recent_too_long: self.recent_too_long.to_vec(),
            rate_limit: topics.sorted_by_name(&self.rate_limit),
            discard_topics: topics.sorted_by_name(&self.discards),
            possible_duplicate_topics: topics.sorted_by_name(&self.duplicates),
        }
    }
}

/// The current report and the latest finished one. Period k covers
/// `[start0 + k*interval, start0 + (k+1)*interval)` and has report id k.
#[derive(Debug)]
struct Periods {
    start0: u64,
    interval_secs: u64,
    current: Report,
    finished: Option<Report>,
}

impl Periods {
    fn new(start0: u64, interval_secs: u64) -> Self {
        Periods {
            start0,
            interval_secs,
            current: Report::empty(0, start0),
            finished: None,
        }
    }

    fn advance(&mut self, now_secs: u64) {
        // A clock that went back (now < start0, or k < current id) keeps the current period.
        let k = now_secs.saturating_sub(self.start0) / self.interval_secs;
        let start = |k: u64| self.start0 + k * self.interval_secs;
        if k == self.current.id + 1 {
            let done = std::mem::replace(&mut self.current, Report::empty(k, start(k)));
            self.finished = Some(done);
        } else if k > self.current.id + 1 {
            // More than a period passed without any activity or query: whatever the current
            // report held is lost, as in the original (§10.2).
            self.finished = Some(Report::empty(k - 1, start(k - 1)));
            self.current = Report::empty(k, start(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn metrics() -> Metrics {
        Metrics::new(MetricsConfig {
            bad_msg_prefix_size: 8,
            ..MetricsConfig::default()
        })
    }

    #[test]
    fn counter_names_are_unique_and_complete() {
        let mut names: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
        for name in [
            "MsgCreate",
            "UnixStreamInputSocketRead",
            "MetadataResponseIncomplete10",
            "MetadataResponseNegativeTopicCount",
            "ConnectorTruncateLongTimeout",
            "ProduceResponseTruncated5",
            "AckErrorUnsupportedForMessageFormat",
            "AckErrorUndocumented",
            "LogToStdoutStderrFailedSysError",
        ] {
            assert!(names.contains(&name), "{name}");
        }
        assert_eq!(
            Counter::ALL
                .iter()
                .filter(|c| c.name().starts_with("AckError"))
                .count(),
            45
        );
    }

    #[test]
    fn ack_error_counters_by_code() {
        assert_eq!(Counter::for_ack_error(0), Counter::AckOk);
        assert_eq!(Counter::for_ack_error(-1), Counter::AckErrorUnknown);
        assert_eq!(Counter::for_ack_error(1), Counter::AckErrorOffsetOutOfRange);
        assert_eq!(
            Counter::for_ack_error(13),
            Counter::AckErrorNetworkException
        );
        assert_eq!(
            Counter::for_ack_error(19),
            Counter::AckErrorNotEnoughReplicas
        );
        assert_eq!(
            Counter::for_ack_error(43),
            Counter::AckErrorUnsupportedForMessageFormat
        );
        assert_eq!(Counter::for_ack_error(44), Counter::AckErrorUndocumented);
        assert_eq!(Counter::for_ack_error(-2), Counter::AckErrorUndocumented);
    }

    #[test]
    fn reason_names_and_indexes() {
        for (i, r) in DiscardReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        assert_eq!(
            DiscardReason::NoAvailablePartitions.as_str(),
            "no_available_partitions"
        );
        assert_eq!(
            DiscardReason::UnsupportedApiKey.as_str(),
            "unsupported_api_key"
        );
    }

    #[test]
    fn counters_add_and_get() {
        let m = metrics();
        m.inc(Counter::MsgCreate);
        m.add(Counter::MsgCreate, 4);
        assert_eq!(m.get(Counter::MsgCreate), 5);
        assert_eq!(m.get(Counter::MsgDestroy), 0);
    }

    #[test]
    fn topics_are_interned_and_capped() {
        let m = Metrics::new(MetricsConfig {
            max_topics: 70,
            ..MetricsConfig::default()
        });
        assert_eq!(m.topic_id(b""), Some(NO_TOPIC));
        let a = m.topic_id(b"a");
        assert_eq!(a, Some(1));
        assert_eq!(m.topic_id(b"a"), a);
        for i in 2..=70 {
            assert_eq!(m.topic_id(format!("t{i}").as_bytes()), Some(i));
        }
        assert_eq!(m.topic_id(b"one too many"), None);
        assert_eq!(&*m.topic_name(70), b"t70");
        assert_eq!(&*m.topic_name(NO_TOPIC), b"");
        assert_eq!(&*m.topic_name(999), b"");
        // An unknown id is counted as NO_TOPIC rather than lost.
        m.received(999, 1);
        assert_eq!(m.snapshot_topics()[0].received, 1);
        assert_eq!(m.snapshot_topics().len(), 71);
    }

    #[test]
    fn accounting_and_in_flight() {
        let m = metrics();
        let t = m.topic_id(b"t").unwrap();
        m.received(t, 10);
        m.delivered(t, 4);
        m.discarded(t, DiscardReason::KafkaError, 2, 5, 9);
        m.discarded(t, DiscardReason::BadTopic, 1, 1, 1);
        m.possible_duplicates(t, 3, 1, 2);
        m.queue_add(t, QueueState::AckWait, 3);
        m.queue_add(t, QueueState::AckWait, -1);
        let s = &m.snapshot_topics()[1];
        assert_eq!(&*s.name, b"t");
        assert_eq!((s.received, s.delivered, s.discarded_total()), (10, 4, 3));
        assert_eq!(s.discarded(DiscardReason::KafkaError), 2);
        assert_eq!(s.in_flight, 3);
        assert_eq!(s.possible_duplicates, 3);
        assert_eq!(s.queued.ack_wait, 2);
        assert_eq!(m.total_in_flight(), 3);
    }

    #[test]
    fn reports_collect_discards() {
        let m = metrics();
        let t = m.topic_id(b"zz").unwrap();
        let u = m.topic_id(b"aa").unwrap();
        m.discarded(t, DiscardReason::RateLimit, 2, 10, 20);
        m.discarded(t, DiscardReason::RateLimit, 1, 5, 15);
        m.discarded(u, DiscardReason::Shutdown, 1, 7, 7);
        m.discarded(t, DiscardReason::BadTopic, 3, 0, 0);
        m.received(NO_TOPIC, 6);
        m.input_discard(DiscardReason::Malformed, b"0123456789");
        m.input_discard(DiscardReason::UnsupportedApiKey, b"x");
        m.unsupported_version(3, b"x");
        m.unsupported_version(3, b"x");
        m.unclean_disconnect(true, b"tcp");
        m.too_long_sample(b"topic", b"value-long");
        let r = m.discard_reports(now_secs()).current;
        assert_eq!(r.id, 0);
        assert_eq!(r.start_secs, m.start_secs());
        assert_eq!(r.malformed_count, 1);
        assert_eq!(r.recent_malformed, vec![Box::from(&b"01234567"[..])]);
        assert_eq!(r.unsupported_api_key_count, 1);
        assert_eq!(
            (r.unsupported_version_count, r.unsupported_versions.clone()),
            (2, vec![(3, 2)])
        );
        assert_eq!((r.tcp_unclean_count, r.unix_stream_unclean_count), (1, 0));
        assert_eq!(r.recent_tcp_unclean.len(), 1);
        assert_eq!(r.bad_topic_count, 3);
        assert_eq!(r.recent_bad_topics, vec![Box::from(&b"zz"[..])]);
        assert_eq!(r.recent_too_long, vec![Box::from(&b"topic va"[..])]);
        assert_eq!(r.rate_limit, vec![(Arc::from(&b"zz"[..]), 3)]);
        let names: Vec<&[u8]> = r.discard_topics.iter().map(|(n, _)| &**n).collect();
        assert_eq!(names, vec![&b"aa"[..], &b"zz"[..]]);
        assert_eq!(
            r.discard_topics[1].1,
            TopicRange {
                count: 3,
                min_timestamp: 5,
                max_timestamp: 20
            }
        );
        let none = &m.snapshot_topics()[0];
        assert_eq!(none.discarded_total(), 5);
        assert_eq!(none.in_flight, 1);
    }

    #[test]
    fn lru_moves_duplicates_to_front_and_caps() {
        let mut l = Lru::default();
        for i in 0..30u8 {
            l.push(&[i]);
        }
        assert_eq!(l.items.len(), LRU_CAPACITY);
        assert_eq!(&*l.items[0], &[29]);
        assert_eq!(&*l.items[24], &[5]);
        l.push(&[10]);
        assert_eq!(l.items.len(), LRU_CAPACITY);
        assert_eq!(&*l.items[0], &[10]);
        assert_eq!(&*l.items[1], &[29]);
    }

    #[test]
    fn periods_roll_over() {
        let mut p = Periods::new(1000, 10);
        p.current.malformed = 1;
        p.advance(1009);
        assert_eq!((p.current.id, p.current.malformed), (0, 1));
        assert!(p.finished.is_none());
        p.advance(1010);
        assert_eq!(
            (p.current.id, p.current.start_secs, p.current.malformed),
            (1, 1010, 0)
        );
        let f = p.finished.as_ref().unwrap();
        assert_eq!((f.id, f.start_secs, f.malformed), (0, 1000, 1));
        p.current.malformed = 7;
        // Skipping a whole period loses both.
        p.advance(1035);
        assert_eq!(
            (p.current.id, p.current.start_secs, p.current.malformed),
            (3, 1030, 0)
        );
        let f = p.finished.as_ref().unwrap();
        assert_eq!((f.id, f.start_secs, f.malformed), (2, 1020, 0));
        // A clock going back changes nothing.
        p.advance(900);
        assert_eq!(p.current.id, 3);
    }

    #[test]
    fn health_moves_forward() {
        let m = metrics();
        assert_eq!(m.health(), Health::Starting);
        m.set_health(Health::InputsOpen);
        assert_eq!(m.health(), Health::InputsOpen);
        m.metadata_updated(true);
        assert_eq!(m.health(), Health::Ready);
        let m = metrics();
        m.set_health(Health::Ready);
        m.set_health(Health::InputsOpen);
        assert_eq!(m.health(), Health::Ready);
    }

    #[test]
    fn discard_query_check() {
        let m = metrics();
        let s = m.start_secs();
        assert!(!m.check_discard_query(s + 600));
        assert!(m.check_discard_query(s + 601));
        assert_eq!(m.get(Counter::NoDiscardQuery), 1);
        m.note_discard_query(s + 601);
        assert!(!m.check_discard_query(s + 700));
    }

    #[test]
    fn invariant_holds_under_concurrent_updates() {
        let m: &'static Metrics = Box::leak(Box::new(metrics()));
        let topics: Vec<TopicId> = (0..4)
            .map(|i| m.topic_id(format!("topic{i}").as_bytes()).unwrap())
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let checker = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut scrapes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for s in m.snapshot_topics() {
                        assert!(s.in_flight >= 0, "negative in_flight: {s:?}");
                        let sum = s.delivered + s.discarded_total();
                        assert_eq!(s.received, sum + s.in_flight as u64);
                    }
                    scrapes += 1;
                }
                scrapes
            })
        };
        let workers: Vec<_> = (0..3)
            .map(|w| {
                let topics = topics.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let t = topics[(i as usize + w) % topics.len()];
                        m.received(t, 1);
                        match i % 5 {
                            0 => m.discarded(t, DiscardReason::KafkaError, 1, 1, 1),
                            1 => m.discarded(t, DiscardReason::Shutdown, 1, 1, 1),
                            _ => m.delivered(t, 1),
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        assert!(checker.join().unwrap() > 0);
        let total: u64 = m.snapshot_topics().iter().map(|s| s.received).sum();
        assert_eq!(total, 60_000);
        assert_eq!(m.total_in_flight(), 0);
    }
}
