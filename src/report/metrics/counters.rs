//! The counter catalogue: Dory's named counters (served by `/counters`) and the discard
//! reasons every discard is counted under.

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
    /// A spooled topic's message the spool could not take (`spool.max_bytes` reached,
    /// disk full or a write error).
    SpoolFull,
}

impl DiscardReason {
    /// Every reason, in a stable order (the order of `/metrics` output).
    /// How many reasons there are.
    pub const COUNT: usize = 14;

    pub const ALL: [DiscardReason; DiscardReason::COUNT] = [
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
        DiscardReason::SpoolFull,
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
            DiscardReason::SpoolFull => "spool_full",
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
    // dory: the idempotent producer. A producer id (and epoch) arrived from InitProducerId;
    // an epoch bump or a new id was asked for; the cluster refused idempotence and dory fell
    // back; the broker recognised a resend (DUPLICATE_SEQUENCE_NUMBER) or found a batch out
    // of order; a partition's sequence was renumbered after a gap.
    ProducerIdReceived, ProducerEpochBumpRequested, ProducerIdResetRequested,
    IdempotenceFallback, AckDuplicateSequence, AckOutOfOrderSequence, SequenceRewind,
    // dory: a broker connection refused for security reasons: the TLS handshake or session
    // failed (untrusted certificate, wrong name, plaintext listener), or SASL did not
    // authenticate (wrong credentials, mechanism not enabled).
    ConnectorTlsFail, ConnectorAuthFail,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
